"""The ``model`` and ``train`` sections: which network every device trains, and the federation's budget
(rounds, participation, local work) every method shares, with the rules of its fields (:func:`check_train`)."""

from __future__ import annotations

from dataclasses import dataclass

from lcfed.config.overrides import resolve
from lcfed.errors import require

__all__ = ["MAX_LOCAL_EPOCHS", "MAX_LOCAL_STEPS", "MAX_ROUNDS", "ModelConfig", "TrainConfig", "check_train"]


@dataclass(frozen=True)
class ModelConfig:
    """Which network every device trains."""

    name: str = "lenet5"

    def validate(self, prefix: str = "model") -> None:
        resolve("model", f"{prefix}.name", self.name)


@dataclass(frozen=True)
class TrainConfig:
    """The federation's budget: rounds, participation and local work, shared by every method."""

    rounds: int = 20
    lr: float = 0.05
    batch_size: int = 32
    local_steps: int | None = 10
    local_epochs: int | None = None
    participation: float = 1.0
    eval_every: int = 1
    eval_devices: int = 0
    final_eval_devices: int = -1  # the last round's: -1 auto (a sample above FINAL_EVAL_AUTO devices), 0 all, N

    def validate(self, prefix: str = "train") -> None:
        check_train(self, prefix)


# Work that never ends: the budget's upper bounds. A run stops cleanly only between rounds (a signal
# finishes the round it is in, checkpoints and exits; the progress and its ETA move a round at a time), so the
# work inside one round is bounded, not estimated: a typo such as local_steps=10000000 would run for days with
# no progress line and no clean stop. The rounds are bounded too, though each shows its progress and can be
# stopped: every round adds a history row and its MLflow points, and no schedule in the literature comes near.
#: ``train.rounds``: 100x the longest schedules (FedAvg-style runs of 1,000-2,000 rounds)
MAX_ROUNDS = 100_000


#: ``train.local_steps``: minibatches a device trains each round (the papers' are 1-500; 100,000 lenet5 steps
#: are minutes per device, hours per round for a federation)
MAX_LOCAL_STEPS = 100_000


#: ``train.local_epochs``: full passes over a device's samples each round (the papers' are 1-50)
MAX_LOCAL_EPOCHS = 1_000


def check_train(train: TrainConfig, prefix: str = "train") -> None:
    """``train.*``: the budget every method shares."""
    require(1 <= train.rounds <= MAX_ROUNDS, f"{prefix}.rounds", train.rounds,
            f"must be >= 1 and <= {MAX_ROUNDS:,} (rounds of the run)")
    require(train.lr > 0, f"{prefix}.lr", train.lr, "must be > 0")
    require(train.batch_size >= 1, f"{prefix}.batch_size", train.batch_size, "must be >= 1")
    require(
        (train.local_steps is None) != (train.local_epochs is None),
        f"{prefix}.local_steps",
        train.local_steps,
        "set exactly one of train.local_steps and train.local_epochs (the other null)",
    )
    if train.local_steps is not None:
        require(1 <= train.local_steps <= MAX_LOCAL_STEPS, f"{prefix}.local_steps", train.local_steps,
                f"must be >= 1 and <= {MAX_LOCAL_STEPS:,} (minibatches per device per round; a run stops only "
                "between rounds)")
    if train.local_epochs is not None:
        require(1 <= train.local_epochs <= MAX_LOCAL_EPOCHS, f"{prefix}.local_epochs", train.local_epochs,
                f"must be >= 1 and <= {MAX_LOCAL_EPOCHS:,} (passes over each device's samples per round; a run "
                "stops only between rounds)")
    require(
        0 < train.participation <= 1, f"{prefix}.participation", train.participation, "must be in (0, 1]"
    )
    require(train.eval_every >= 1, f"{prefix}.eval_every", train.eval_every, "must be >= 1")
    require(train.eval_devices >= 0, f"{prefix}.eval_devices", train.eval_devices,
            "must be >= 0 (trained devices scored by an evaluation before the last round; 0 = every device)")
    require(train.final_eval_devices >= -1, f"{prefix}.final_eval_devices", train.final_eval_devices,
            "must be -1 (auto: every device up to 10,000, a seeded sample of 10,000 above), 0 (every device) "
            "or N >= 1 (a seeded sample of N trained devices)")
