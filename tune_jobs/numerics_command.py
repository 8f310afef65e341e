"""``lcfed numerics``: this machine's kernel fingerprint under a numerics profile, compared with the reference
fingerprints lcfed ships, so a user knows before a run whether their numbers will be the docs'."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from lcfed import numerics
from lcfed.config.engine import machine_limits, threads_why
from lcfed.errors import require
from lcfed.numerics import fingerprint
from lcfed.run.output_paths import check_output_file
from tune_jobs.options import examples


def add_parser(sub: Any) -> None:
    """Register ``lcfed numerics`` on the CLI's subparsers."""
    p = sub.add_parser(
        "numerics", help="print this machine's kernel fingerprint and compare it with the shipped references",
        description="Run every floating-point kernel a run uses (convolutions, matmuls, LAPACK, k-means, the "
        "local update, LCFed's projector, ...) on fixed inputs under a numerics profile, hash each result, and "
        "compare the hashes with the reference fingerprints lcfed ships. Equal fingerprints mean equal numbers "
        "for the same config and seed; a differing kernel is named. Runs record the digest as provenance."
        "fingerprint. Exit 1 with --check when the fingerprint equals no reference.",
        epilog=examples("lcfed numerics", "lcfed numerics --kernels", "lcfed numerics --profile native --check",
                        "lcfed numerics --json mine.json --name my-laptop"))
    p.add_argument("--profile", choices=numerics.PROFILES, default="portable",
                   help="the numerics profile (engine.numerics) to fingerprint (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads, as engine.torch_threads (default: %(default)s)")
    p.add_argument("--kernels", action="store_true", help="also print each kernel's hash")
    p.add_argument("--json", metavar="FILE", help="write the fingerprint as JSON (a reference file's format)")
    p.add_argument("--name", default="", help="the name recorded in --json's file (default: the CPU model)")
    p.add_argument("--check", action="store_true", help="exit 1 when the fingerprint equals none of the references")
    p.set_defaults(func=cmd_numerics)


def cmd_numerics(args: argparse.Namespace) -> int:
    cpus, max_threads, _ = machine_limits()  # engine.torch_threads' bounds
    require(1 <= args.threads <= max_threads, "--threads", args.threads,
            f"must be in [1, {max_threads}] ({threads_why(cpus)}, as engine.torch_threads)")
    check_output_file(args.json, "--json")  # before the fingerprint's minute of work, not after
    if args.profile != numerics.env_profile():
        # numpy and OpenBLAS took this process's profile when they loaded: a child with the asked one
        argv = ["numerics", "--profile", args.profile, "--threads", str(args.threads)]
        argv += ["--kernels"] * args.kernels + ["--check"] * args.check
        argv += ["--json", args.json] if args.json else []
        argv += ["--name", args.name] if args.name else []
        env = {**os.environ, numerics.ENV_PROFILE: args.profile}
        return subprocess.run([sys.executable, "-m", "tune_jobs.cli", *argv], env=env, check=False).returncode
    state = numerics.activate(args.profile)  # before the first tensor op of this process
    mine = fingerprint.for_process(args.threads)
    m = mine.machine
    refs = fingerprint.references()
    print(f"kernel fingerprint {mine.digest}  ({state['profile']} profile, {args.threads} thread"
          f"{'s' if args.threads != 1 else ''}, {len(mine.kernels)} kernels)")
    print(f"  {m.get('cpu')} ({m.get('cpu_vendor') or '?'}, {m.get('cpu_isa')}): ATen {m.get('kernels')}, "
          f"oneDNN {m.get('onednn_isa')}, MKL {m.get('mkl_cbwr')}, OpenBLAS {m.get('openblas')}, "
          f"numpy {m.get('numpy_simd')}")
    print("  " + ", ".join(f"{lib} {m.get(lib)}" for lib in ("torch", "numpy", "scipy", "scikit-learn")))
    if state.get("note"):
        print(f"  note: {state['note']}")
    if args.kernels:
        for line in mine.lines():
            print(f"    {line}")
    print("against the references lcfed ships:")
    for line in fingerprint.report(mine, refs):
        print(line)
    same = fingerprint.matching(mine, refs)
    if same:
        print(f"a config and seed give this machine the same numbers as on {' and '.join(same)}")
    else:
        print("no reference matches: this machine's numbers for a config and seed will differ from theirs in the "
              "last bits, and trajectories may part; the kernels named above are why")
    if args.json:
        out = fingerprint.Fingerprint(mine.kernels, mine.machine, args.name or str(m.get("cpu", "")), mine.note)
        Path(args.json).write_text(json.dumps(out.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 1 if args.check and not same else 0
