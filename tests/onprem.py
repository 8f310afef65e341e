"""Machines for an on-prem ``ray up`` on this one machine: each a set of Linux namespaces running its own sshd.

A machine is ``unshare --net --mount --pid --fork --mount-proc`` around ``sshd -D`` (root's login): its own
network stack (an address on a bridge, so ``cluster.yaml``'s fixed ports 6379, 8076, 8265, 5000 are its own),
its own process table (``ray stop`` run there sees only that machine's processes: sshd is its PID 1, and when it
exits the kernel kills whatever is left in it), and its own mounts: an empty ``/tmp`` (Ray's default temp dir and
its address file, which ``ray stop`` removes), ``/run`` and ``/home``, with ``/home/ray`` a folder of its own and
root's home there (a private ``/etc/passwd``), as in ``cluster.yaml``'s containers. Its "image" is a venv at
``/home/ray/venv`` layered over this checkout's ``.venv`` (same Python, Ray and torch; no download), with pip
offline, so the setup commands install the project as written.

The launcher (``ray up``, ``lcfed submit``, ``ray dashboard``) runs in a namespace of its own holding the bridge
(:meth:`Machines.launcher`), so its ``127.0.0.1:8265`` and ``:5000`` port-forwards are private too. Needs root.
Run ``python -m tests.onprem start|stop DIR`` to keep machines up by hand (docs/tutorials/onprem.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
VENV = Path(os.path.realpath(BIN)).parent  # where its scripts' #! lines point, also through a symlinked .venv
SUBNET = "10.77.0"  # inside the launcher's own namespace: no route of this machine's is involved
HOME = "/home/ray"


def _sh(*cmd: str, net: int | None = None) -> None:
    """A command in this machine's namespaces, or in those of the process ``net`` (its network)."""
    prefix = ["nsenter", f"--net=/proc/{net}/ns/net"] if net else []
    subprocess.run([*prefix, *cmd], check=True, capture_output=True, timeout=30)


def _image(home: Path, env: Mapping[str, str]) -> None:
    """The machine's "image": ``~/venv`` over this ``.venv`` (its site-packages on the path, its console scripts
    run by the new interpreter, ``lcfed`` left to the setup commands) and a login profile with ``env``."""
    venv = home / "venv"
    base = Path(os.path.realpath(sys.executable)).parent / "python3"  # the interpreter the .venv was made from
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    # a plain path, not site.addsitedir: the .venv's own .pth files (its editable lcfed) stay out
    (venv / site / "_image.pth").write_text(f"{VENV / site}\n")
    for script in (VENV / "bin").iterdir():
        if script.name == "lcfed" or not script.is_file() or script.name.startswith(("python", "activate")):
            continue
        head, _, rest = script.read_bytes().partition(b"\n")
        if head.startswith(b"#!" + str(VENV / "bin" / "python").encode()):
            target = venv / "bin" / script.name
            target.write_bytes(f"#!{HOME}/venv/bin/python\n".encode() + rest)
            target.chmod(0o755)
    lines = [f"export PATH={HOME}/venv/bin:$PATH",
             # offline installs from what the image has (no index, no isolated build env)
             "export PIP_NO_INDEX=1 PIP_NO_BUILD_ISOLATION=0 PIP_DISABLE_PIP_VERSION_CHECK=1",
             "export RAY_USAGE_STATS_ENABLED=0 RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION=0.02",
             *(f"export {k}={shlex.quote(v)}" for k, v in env.items())]
    (home / ".bash_profile").write_text("\n".join(lines) + "\n")
    (home / ".bashrc").write_text(f". {HOME}/.bash_profile\n")


_BOOT = """while [ ! -e {ready} ]; do sleep 0.1; done
mount -t tmpfs tmpfs /home && mkdir -p /home/ray /home/ubuntu && mount --bind {home} /home/ray
mount --bind {passwd} /etc/passwd
mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /run && mkdir -p /run/sshd
if [ -d /root/.ray ]; then mount -t tmpfs tmpfs /root/.ray; fi
exec /usr/sbin/sshd -D -e -f {config}
"""


@dataclass
class Machines:
    """Started by :meth:`start`; ``ips`` maps a machine's name to its address, ``key`` logs in as root on
    each; :meth:`stop` ends them all."""

    base: Path
    key: Path
    net: int = 0  # the launcher namespaces' holder
    nodes: dict[str, int] = field(default_factory=dict)  # each machine's unshare
    ips: dict[str, str] = field(default_factory=dict)
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)  # to reap, where started here

    @classmethod
    def attach(cls, base: Path) -> Machines:
        """The machines :meth:`start` left running in ``base`` (another process's)."""
        state = json.loads((Path(base) / "state.json").read_text())
        return cls(Path(base), Path(state["key"]), state["net"], state["nodes"], state["ips"])

    @classmethod
    def start(cls, envs: Mapping[str, Mapping[str, str]], base: Path | None = None) -> Machines:
        """One machine per name in ``envs`` (in order: the first is ``.2``, then ``.3`` ...), each with that
        environment in its login profile (:func:`actors.onprem.node_environment`)."""
        base = Path(base or tempfile.mkdtemp(prefix="onprem-", dir="/var/tmp"))  # /tmp is private to machines
        base.mkdir(parents=True, exist_ok=True)
        key = base / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        machines = cls(base, key)
        try:
            # the launcher's namespaces: the bridge's network, and a /tmp of its own (Ray's SSH control
            # sockets, its provider-config cache and the local provider's state file go there)
            holder = machines._spawn(["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
                                      "mount -t tmpfs tmpfs /tmp && exec sleep infinity"])
            machines.net = holder
            time.sleep(0.5)  # until unshare has exec'd
            _sh("sh", "-c", f"ip link set lo up && ip link add br0 type bridge && "
                f"ip addr add {SUBNET}.1/24 dev br0 && ip link set br0 up", net=holder)
            for i, (name, env) in enumerate(envs.items()):
                machines._boot(name, f"{SUBNET}.{i + 2}", env, i)
            (base / "state.json").write_text(json.dumps(machines.state()))
        except BaseException:
            machines.stop()
            raise
        return machines

    def _spawn(self, cmd: list[str], log: Path | None = None) -> int:
        with open(log or os.devnull, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self._children.append(proc)
        return proc.pid

    def _boot(self, name: str, ip: str, env: Mapping[str, str], index: int) -> None:
        root = self.base / name
        home = root / "home"
        home.mkdir(parents=True)
        _image(home, env)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key")], check=True)
        passwd = "".join(f"root:x:0:0:root:{HOME}:/bin/bash\n" if line.startswith("root:") else line
                         for line in Path("/etc/passwd").read_text().splitlines(keepends=True))
        (root / "passwd").write_text(passwd)
        (root / "sshd_config").write_text(
            f"ListenAddress {ip}:22\nHostKey {root / 'host_key'}\nAuthorizedKeysFile {self.key}.pub\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nPidFile none\nUseDNS no\nPrintMotd no\nMaxSessions 64\nMaxStartups 64\n")
        boot = _BOOT.format(ready=root / "ready", home=home, passwd=root / "passwd", config=root / "sshd_config")
        pid = self._spawn(["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--propagation",
                           "private", "sh", "-c", boot], root / "sshd.log")
        self.nodes[name], self.ips[name] = pid, ip
        time.sleep(0.5)  # until unshare has made the namespaces
        veth = f"vh{index}"
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(pid), net=self.net)
        _sh("ip", "link", "set", veth, "master", "br0", "up", net=self.net)
        _sh("sh", "-c", f"ip link set lo up && ip addr add {ip}/24 dev eth0 && ip link set eth0 up && "
            f"ip route add default via {SUBNET}.1", net=pid)
        (root / "ready").touch()
        self.ssh(name, "true", timeout=60)

    def launcher(self, cmd: Sequence[str], cwd: Path | str | None = None) -> list[str]:
        """``cmd`` run in the launcher's namespaces (the bridge's network: every machine is reachable), in
        ``cwd`` (default: this process's; nsenter would take the namespace holder's)."""
        return ["nsenter", f"--net=/proc/{self.net}/ns/net", f"--mount=/proc/{self.net}/ns/mnt",
                f"--wd={cwd or os.getcwd()}", *cmd]

    def ssh(self, name: str, command: str, timeout: float = 60) -> str:
        """``command`` in a login shell on machine ``name``; its output. Retries while sshd starts."""
        cmd = self.launcher(["ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o",
                             "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                             f"root@{self.ips[name]}", f"bash --login -c {shlex.quote(command)}"])
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if out.returncode == 0 or time.monotonic() > deadline or out.returncode != 255:
                if out.returncode:
                    raise RuntimeError(f"{name}: {command!r} exited {out.returncode}: {out.stderr[-2000:]}")
                return out.stdout
            time.sleep(0.5)

    def pid_namespace(self, name: str) -> str:
        return os.readlink(f"/proc/{self.nodes[name]}/ns/pid_for_children")

    def processes(self, name: str) -> dict[int, str]:
        """Every process in machine ``name``'s process table (this machine's pid -> command line)."""
        found = {}
        ns = self.pid_namespace(name)
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and os.readlink(entry / "ns/pid") == ns:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        return found

    def state(self) -> dict[str, object]:
        return {"net": self.net, "nodes": self.nodes, "ips": self.ips, "key": str(self.key)}

    def stop(self, remove: bool = True) -> None:
        """SIGKILL every machine's unshare (its sshd, PID 1 there, goes and the kernel ends the rest) and the
        launcher's namespace; ``remove``: their folder too."""
        for pid in [*self.nodes.values(), *([self.net] if self.net else [])]:
            with contextlib.suppress(OSError):  # a process group of ours only: an unshare, or the holder's sleep
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith((b"unshare\0", b"sleep\0infinity")):
                    os.killpg(pid, signal.SIGKILL)
        for proc in self._children:
            proc.wait(timeout=30)
        deadline = time.monotonic() + 30  # another process's: gone once no /proc entry is left
        while any(Path(f"/proc/{p}").exists() for p in self.nodes.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if remove and not os.environ.get("LCFED_KEEP_CLUSTER"):
            shutil.rmtree(self.base, ignore_errors=True)


def launcher_env(base: Path, **extra: str) -> dict[str, str]:
    """The launcher's environment: this venv's tools, a home of its own in ``base`` (its ``~/.ray/auth_token``,
    which ``cluster.yaml`` mounts on every machine), and Ray's autoscaler v1 (v2 loses the local provider's head:
    it never records it in the head's state file, marks it terminated, and launches one worker of two)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    (base / "launcher").mkdir(exist_ok=True)
    return {**env, "HOME": str(base / "launcher"), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "RAY_UP_enable_autoscaler_v2": "0", "RAY_USAGE_STATS_ENABLED": "0", **extra}


def main(argv: Sequence[str] | None = None) -> int:
    """``start DIR [--workers N]``: machines ``head``, ``w1`` ... in DIR and DIR/cluster.yaml, ``cluster.yaml``'s
    on-prem variant for them; ``exec DIR -- CMD``: CMD as the launcher; ``ssh DIR NAME CMD``: CMD in a login shell
    on a machine; ``stop DIR``: end them and remove DIR."""
    import argparse

    import yaml

    from actors.onprem import node_environment, onprem_config, worker_type

    parser = argparse.ArgumentParser(prog="python -m tests.onprem", description=main.__doc__)
    parser.add_argument("action", choices=("start", "exec", "ssh", "stop"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if args.action == "start":
        launcher = yaml.safe_load((Path(__file__).resolve().parents[1] / "cluster.yaml").read_text())
        envs = {"head": node_environment(launcher, launcher["head_node_type"])}
        envs.update({f"w{i + 1}": node_environment(launcher, worker_type(launcher)) for i in range(args.workers)})
        machines = Machines.start(envs, args.dir.resolve())
        config = onprem_config(launcher, machines.ips["head"], [machines.ips[n] for n in envs if n != "head"],
                               ssh_user="root", ssh_private_key=str(machines.key), cluster_name="lcfed-onprem")
        (machines.base / "cluster.yaml").write_text(yaml.safe_dump(config))
        print(f"machines {machines.ips}; config {machines.base / 'cluster.yaml'}")
        return 0
    machines = Machines.attach(args.dir.resolve())
    if args.action == "stop":
        machines.stop()
        return 0
    if args.action == "ssh":
        print(machines.ssh(rest[0], shlex.join(rest[1:]) if len(rest) > 2 else rest[1]), end="")
        return 0
    cmd = machines.launcher(rest)
    os.execvpe(cmd[0], cmd, launcher_env(machines.base))  # the command itself, for job control's kill


if __name__ == "__main__":
    sys.exit(main())
