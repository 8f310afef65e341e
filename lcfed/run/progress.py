"""Progress observer: a tqdm bar on a terminal; without one (a Ray job's log, a pipe), plain lines:
round, accuracy, loss, elapsed and ETA."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from tqdm import tqdm

from lcfed.config import ExperimentConfig
from lcfed.methods.round import Federation, RoundStats
from lcfed.run.result import RunResult

#: seconds between plain progress lines when rounds are quick (every round is printed otherwise)
LINE_EVERY_S = 10.0


def is_tty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


class _Bar(tqdm):
    """tqdm without its monitor thread: the bar moves once a round anyway, and the monitor, a daemon thread
    never joined (started even for a disabled bar), can crash the interpreter as it exits (tqdm#527)."""

    monitor_interval = 0


class ProgressBar:
    """tqdm bar over rounds; shows the latest evaluated accuracy and the training loss. ``disable=None``:
    a bar on a terminal, plain lines elsewhere (so ``lcfed job logs --follow`` shows progress)."""

    def __init__(self, disable: bool | None = None, file: Any = None) -> None:
        self.disable = disable
        self.file = file or sys.stderr
        self.bar: tqdm | None = None
        self.acc = float("nan")
        self.acc_round = -1  # the round acc was evaluated in (-1: none yet)
        self.lines = disable is None and not is_tty(self.file)
        self.t0 = self.last_line = 0.0
        self.rounds = 0

    def on_start(self, cfg: ExperimentConfig, fed: Federation) -> None:
        self.rounds = cfg.train.rounds
        self.t0 = self.last_line = time.monotonic()
        if self.lines:
            return
        self.bar = _Bar(
            total=cfg.train.rounds,
            desc=f"{cfg.method.name} {cfg.data.dataset} m={fed.num_devices}",
            unit="round",
            file=self.file,
            disable=self.disable,
            dynamic_ncols=True,
        )

    def on_round(self, rnd: int, metrics: dict[str, float], stats: RoundStats) -> None:
        acc = metrics.get("acc_mean", math.nan)
        if not math.isnan(acc):  # NaN: this round was not evaluated; keep the last evaluation
            self.acc, self.acc_round = acc, rnd
        if self.lines:
            self._line(rnd, metrics)
            return
        assert self.bar is not None
        self.bar.set_postfix(acc=self._acc(rnd), loss=f"{metrics['train_loss']:.4f}", refresh=False)
        self.bar.update(1)

    def _line(self, rnd: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        last = rnd + 1 >= self.rounds
        if not last and rnd > 0 and now - self.last_line < LINE_EVERY_S:
            return
        self.last_line = now
        elapsed = now - self.t0
        eta = elapsed / (rnd + 1) * (self.rounds - rnd - 1)
        print(f"round {rnd} ({rnd + 1}/{self.rounds})  acc_mean {self._acc(rnd)}  train_loss {metrics['train_loss']:.4f}  "
              f"elapsed {elapsed:.0f} s  eta {eta:.0f} s", file=self.file, flush=True)

    def _acc(self, rnd: int) -> str:
        if self.acc_round < 0:
            return "not evaluated yet"
        return f"{self.acc:.4f}" + ("" if self.acc_round == rnd else f" (round {self.acc_round})")

    def on_end(self, result: RunResult) -> None:
        if self.bar is not None:
            self.bar.close()

    def on_error(self, exc: BaseException) -> None:
        if self.bar is not None:
            self.bar.close()
