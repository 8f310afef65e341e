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
VENV = BIN.parent
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
    for script in BIN.iterdir():
        if script.name == "lcfed" or not script.is_file() or script.name.startswith(("python", "activate")):
            continue
        head, _, rest = script.read_bytes().partition(b"\n")
        if head.startswith(b"#!" + str(BIN / "python").encode()):
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
    net: subprocess.Popen[bytes] | None = None
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ips: dict[str, str] = field(default_factory=dict)

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
            machines.net = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
                                             "mount -t tmpfs tmpfs /tmp && exec sleep infinity"],
                                            start_new_session=True)
            holder = machines.net.pid
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

    def _boot(self, name: str, ip: str, env: Mapping[str, str], index: int) -> None:
        assert self.net is not None
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
        with open(root / "sshd.log", "wb") as log:
            proc = subprocess.Popen(["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc",
                                     "--propagation", "private", "sh", "-c", boot],
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes[name], self.ips[name] = proc, ip
        time.sleep(0.5)  # until unshare has made the namespaces
        veth = f"vh{index}"
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(proc.pid),
            net=self.net.pid)
        _sh("ip", "link", "set", veth, "master", "br0", "up", net=self.net.pid)
        _sh("sh", "-c", f"ip link set lo up && ip addr add {ip}/24 dev eth0 && ip link set eth0 up && "
            f"ip route add default via {SUBNET}.1", net=proc.pid)
        (root / "ready").touch()
        self.ssh(name, "true", timeout=60)

    def launcher(self, cmd: Sequence[str], cwd: Path | str | None = None) -> list[str]:
        """``cmd`` run in the launcher's namespaces (the bridge's network: every machine is reachable), in
        ``cwd`` (default: this process's; nsenter would take the namespace holder's)."""
        assert self.net is not None
        return ["nsenter", f"--net=/proc/{self.net.pid}/ns/net", f"--mount=/proc/{self.net.pid}/ns/mnt",
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
        return os.readlink(f"/proc/{self.nodes[name].pid}/ns/pid_for_children")

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
        assert self.net is not None
        return {"net": self.net.pid, "nodes": {n: p.pid for n, p in self.nodes.items()}, "ips": self.ips,
                "key": str(self.key)}

    def stop(self) -> None:
        """SIGKILL every machine's unshare (its sshd, PID 1 there, goes and the kernel ends the rest) and the
        launcher's namespace."""
        for proc in [*self.nodes.values(), *([self.net] if self.net else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if not os.environ.get("LCFED_KEEP_CLUSTER"):
            shutil.rmtree(self.base, ignore_errors=True)
