"""What ``lcfed run`` and ``lcfed sweep`` print at each verbosity, in real processes (their whole console: Ray,
Tune and MLflow write to the process's streams, and Ray's workers through the driver): the default has none
of Ray's, Tune's or MLflow's own lines, ``-v`` has them, ``--resume`` says which run and round it continues.

Slow (three ``lcfed`` processes starting Ray): ``make test-slow``. In the fast suite, ``-q``'s summary-only
output is counted in ``tests/test_e2e.py`` and the switches each verbosity sets in ``tests/test_naming.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lcfed.config import to_dict
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow]  # every test: `-m` leaves the file unimported

#: lines Ray, Tune and MLflow print by themselves (docs/run.md, "How much a command prints")
CHATTER = re.compile(r"Token authentication is enabled|Started a local Ray instance|INFO mlflow\.|"
                     r"Configuration for experiment|View detailed results here|tensorboard --logdir|🏃 View run|"
                     r"\(DeviceActor pid=")


def _lcfed(cwd: Path, *args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "tune_jobs", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (proc.stdout + proc.stderr).splitlines()


@pytest.mark.slow  # ~2 min: three lcfed processes with Ray; -q is counted in test_e2e, the switches in test_naming
@pytest.mark.timeout(1200)
def test_default_is_free_of_library_chatter_verbose_shows_it_and_resume_says_where(tmp_path):
    base = tiny_config("train.rounds=2", "engine.num_cpus=2", "tracking.enabled=true", "tracking.experiment=verbosity",
                       f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"checkpoint.dir={tmp_path / 'ck'}")
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(to_dict(base)))
    default = _lcfed(tmp_path, "run", "-c", str(config), "--engine", "ray", "--json", str(tmp_path / "run.json"))
    assert not [line for line in default if CHATTER.search(line)], default
    assert default[0].startswith("partition: ") and any(line.startswith("round 1 (2/2)  acc_mean") for line in default)
    run_id = json.loads((tmp_path / "run.json").read_text())["run_id"]

    verbose = _lcfed(tmp_path, "run", "-c", str(config), "--engine", "ray", "--resume", "-v", "--set", "train.rounds=3")
    assert f"lcfed: resuming MLflow run {run_id} at round 2 of rounds 0-2 (checkpoint {tmp_path / 'ck' / 'latest.pt'})" in verbose
    said = "\n".join(verbose)
    for line in ("Started a local Ray instance",):  # (MLflow's system-metrics lines: off unless asked)
        assert line in said, said

    sweep = _lcfed(tmp_path, "sweep", "-c", str(config), "--space", "mu_lambda.yaml", "--num-samples", "1",
                   "--scheduler", "fifo", "--storage", str(tmp_path / "tune"), "--name", "quiet-sweep", "--set", "checkpoint.dir=null")
    assert not [line for line in sweep if CHATTER.search(line)], sweep
    assert any(line.startswith("sweep: 1/1 trials ended") for line in sweep)  # lcfed's own table stays
