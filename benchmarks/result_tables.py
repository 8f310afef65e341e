"""The result tables of docs/run.md, regenerated from real runs (`lcfed run`, one process each).

Tables: ``demo-start`` (`make demo`'s LCFed run cut to 3 rounds, its last accuracy and loss to every
digit), ``demo-seeds`` (configs/demo.yaml for LCFed, FedAvg and Standalone on seeds 0-4, with the mean
± 95 % CI and the paired differences) and ``splits`` (the other digits splits tried: the previous demo,
pathological n = 2, 20 devices, 25 % test, 30 rounds, μ = λ = 0.1, and its variants). A cell is the
personalized test accuracy, mean of the last 3 evaluations (``last_evals.acc_mean``), in %. Every run
uses the portable numerics profile (the default), so the tables are the same on any x86-64 CPU.

``--write`` replaces the tables in docs/run.md (between ``<!-- result_tables:NAME -->`` markers), and the
sentence that states the runs' kernel fingerprint (``<!-- result_tables:fingerprint -->``);
``--check`` exits 1 when docs/run.md differs from the runs. Both print the tables.

    python benchmarks/result_tables.py [--tables demo-start,demo-seeds,splits] [--jobs 2] [--write | --check]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.learning.stats import mean_ci, paired_test  # noqa: E402

PAGE = ROOT / "docs" / "run.md"
#: the kernel fingerprints of the runs made (one, or the tables would mix machines' numbers)
FINGERPRINTS: set[str] = set()
DEMO = ROOT / "configs" / "demo.yaml"
METHODS = ("lcfed", "fedavg", "standalone")
LABELS = {"lcfed": "LCFed", "fedavg": "FedAvg", "standalone": "Standalone"}
SEEDS = (0, 1, 2, 3, 4)
#: the previous demo: pathological n = 2, 20 devices, 25 % test, 30 rounds, LCFed with mu = lam = 0.1
PREVIOUS = ("data.partition=pathological", "data.classes_per_device=2", "data.test_fraction=0.25", "train.rounds=30")
PREVIOUS_LCFED = ("method.mu=0.1", "method.lam=0.1")
#: (label, seed, overrides of PREVIOUS, overrides for LCFed only)
SPLITS: tuple[tuple[str, int, tuple[str, ...], tuple[str, ...]], ...] = (
    ("pathological n = 2, 20 devices (the previous demo)", 0, (), ()),
    *((("pathological n = 3, 40 devices", s, ("data.classes_per_device=3", "data.num_devices=40"), ()))
      for s in (0, 1, 2)),
    ("pathological n = 3, 40 devices, μ = λ = 1", 1, ("data.classes_per_device=3", "data.num_devices=40"),
     ("method.mu=1", "method.lam=1")),
    ("pathological n = 3, 60 devices, 20 rounds", 0,
     ("data.classes_per_device=3", "data.num_devices=60", "train.rounds=20"), ()),
    ("pathological n = 4, 60 devices, 20 rounds", 0,
     ("data.classes_per_device=4", "data.num_devices=60", "train.rounds=20"), ()),
    ("primary/secondary, 20 devices", 0, ("data.partition=primary_secondary",), ()),
    ("primary/secondary, 20 devices, μ = λ = 1", 0, ("data.partition=primary_secondary",),
     ("method.mu=1", "method.lam=1")),
    ("Dirichlet α = 0.3, 30 devices", 0, ("data.partition=dirichlet", "data.alpha=0.3", "data.num_devices=30"), ()),
)


def run(overrides: tuple[str, ...], work: Path) -> float:
    """One `lcfed run` of the demo config with ``overrides``: its mean of the last 3 evaluations."""
    return float(summary_of(overrides, work)["last_evals"]["acc_mean"])


def summary_of(overrides: tuple[str, ...], work: Path) -> dict:
    """One `lcfed run` of the demo config with ``overrides``: its ``--json`` summary."""
    out = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    cmd = [sys.executable, "-m", "tune_jobs.cli", "run", "-c", str(DEMO), "--no-track", "-q", "--json", str(out)]
    for o in overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads(out.read_text())
    assert summary["provenance"]["numerics"] == "portable", summary["provenance"]
    FINGERPRINTS.add(summary["provenance"]["fingerprint"])
    return summary


def cells(rows: list[tuple[str, dict[str, float]]]) -> list[str]:
    """Markdown rows: the best of each row in bold (ties too)."""
    lines = []
    for head, acc in rows:
        best = max(round(100 * v, 1) for v in acc.values())
        cols = [f"**{100 * acc[m]:.1f}**" if round(100 * acc[m], 1) == best else f"{100 * acc[m]:.1f}" for m in METHODS]
        lines.append(f"| {head} | " + " | ".join(cols) + " |")
    return lines


def demo_seeds(pool: ThreadPoolExecutor, work: Path) -> str:
    jobs = {(s, m): pool.submit(run, (f"seed={s}", f"method.name={m}"), work) for s in SEEDS for m in METHODS}
    acc = {s: {m: jobs[s, m].result() for m in METHODS} for s in SEEDS}
    lines = ["| seed | " + " | ".join(LABELS[m] for m in METHODS) + " |", "|---|---|---|---|"]
    lines += cells([(str(s), acc[s]) for s in SEEDS])
    cis = {m: mean_ci([100 * acc[s][m] for s in SEEDS]) for m in METHODS}
    best = max(cis, key=lambda m: cis[m].mean)
    lines.append("| mean ± 95 % CI | " + " | ".join(
        f"**{cis[m].mean:.2f} ± {cis[m].half:.2f}**" if m == best else f"{cis[m].mean:.2f} ± {cis[m].half:.2f}"
        for m in METHODS) + " |")
    for other in ("fedavg", "standalone"):
        t = paired_test([100 * acc[s]["lcfed"] for s in SEEDS], [100 * acc[s][other] for s in SEEDS])
        firsts = sum(acc[s]["lcfed"] >= max(acc[s].values()) for s in SEEDS)
        print(f"paired: LCFed - {LABELS[other]} = {t.diff.mean:+.1f} ± {t.diff.half:.1f} points "
              f"(t-test p = {t.t_p:.3f}); LCFed first on {firsts} of {len(SEEDS)} seeds", file=sys.stderr)
    return "\n".join(lines)


def splits(pool: ThreadPoolExecutor, work: Path) -> str:
    jobs = {(i, m): pool.submit(run, (*PREVIOUS, *extra, f"seed={seed}", f"method.name={m}",
                                      *((*PREVIOUS_LCFED, *lcfed_only) if m == "lcfed" else ())), work)
            for i, (_, seed, extra, lcfed_only) in enumerate(SPLITS) for m in METHODS}
    rows = [(f"{label} | {seed}", {m: jobs[i, m].result() for m in METHODS})
            for i, (label, seed, _, _) in enumerate(SPLITS)]
    head = ["| split | seed | " + " | ".join(LABELS[m] for m in METHODS) + " |", "|---|---|---|---|---|"]
    return "\n".join(head + cells(rows))


#: rounds of ``demo-start``: few enough for `make test` to rerun them (tests/test_result_tables.py)
START_ROUNDS = 3


def demo_start(pool: ThreadPoolExecutor, work: Path) -> str:
    """`make demo`'s first run cut to :data:`START_ROUNDS` rounds, to every printed digit: a change of the demo's
    numbers shows in `make test` (the whole seed-0 cell is a slow test)."""
    s = pool.submit(summary_of, (f"train.rounds={START_ROUNDS}",), work).result()
    return (f"`make demo`'s LCFed run cut to {START_ROUNDS} rounds (`--set train.rounds={START_ROUNDS}`) ends at "
            f"acc_mean {s['acc_mean']!r}, train_loss {s['train_loss']!r}: the same digits here mean the same kernels "
            "and code as the tables'.")


TABLES = {"demo-seeds": demo_seeds, "splits": splits, "demo-start": demo_start}


def fingerprint_line(digest: str) -> str:
    """The page's statement of the kernel fingerprint the tables were made with (tests/test_result_tables.py reads it)."""
    return (f"The tables were made on machines whose kernel fingerprint is `{digest}` under the portable profile; "
            "`lcfed numerics` prints yours (the same digest gives these numbers to the last digit).")


def marked(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- result_tables:{name} -->\n)(.*?)(\n<!-- /result_tables -->)", re.S)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default=",".join(TABLES))
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (default: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the tables in docs/run.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/run.md's tables differ")
    args = ap.parse_args()
    text = PAGE.read_text()
    differ = []
    with tempfile.TemporaryDirectory(prefix="lcfed-readme-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        for name in args.tables.split(","):
            table = TABLES[name](pool, Path(tmp))
            print(f"\n{name}:\n{table}")
            found = marked(name).search(text)
            if found is None:
                raise SystemExit(f"docs/run.md has no <!-- result_tables:{name} --> marker")
            if found.group(2) != table:
                differ.append(name)
            text = marked(name).sub(lambda mo, t=table: mo.group(1) + t + mo.group(3), text)
        if len(FINGERPRINTS) != 1:
            raise SystemExit(f"the runs came from kernels with different fingerprints: {sorted(FINGERPRINTS)}")
        stated = fingerprint_line(FINGERPRINTS.pop())
        found = marked("fingerprint").search(text)
        if found is None:
            raise SystemExit("docs/run.md has no <!-- result_tables:fingerprint --> marker")
        if found.group(2) != stated:
            differ.append("fingerprint")
        text = marked("fingerprint").sub(lambda mo: mo.group(1) + stated + mo.group(3), text)
    if args.write:
        PAGE.write_text(text)
        print(f"\nwrote {', '.join(args.tables.split(','))} to {PAGE}")
    elif differ:
        print(f"\ndocs/run.md differs from the runs in: {', '.join(differ)}")
        return 1 if args.check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
