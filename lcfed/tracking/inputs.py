"""What went into a run: its params (the flattened config and the federation's facts, ``federation.*``)
and its dataset input (a digest of the partition, its config and statistics).

Separate from the observer because the sweep's trials compute the facts on worker nodes (no MLflow
there) and report them to the driver, and because the partition digest (equal digests, equal devices'
samples) is a pure function of the config that needs no store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from lcfed.config import ExperimentConfig, drop_later_defaults, flatten
from lcfed.experiment import file_source
from lcfed.methods.base import Federation


def federation_facts(fed: Federation) -> dict[str, str]:
    """What the config alone does not say about a federation, logged as ``federation.*`` params: model
    size, and the partition's statistics as ``federation.partition.*`` (train/test sizes, classes per
    device)."""
    return {
        "num_params": str(fed.spec.size),
        "embedding_params": str(fed.spec.embedding_size),
        "train_samples": str(int(fed.train_sizes.sum())),
        **{f"partition.{k}": f"{v:g}" for k, v in fed.partition_stats.items()},
    }


#: params per ``log_batch`` call: MLflow's limit for one batch
PARAMS_PER_BATCH = 100

#: MLflow's limit on a param's value (characters)
PARAM_LENGTH = 6000


def log_params(client: Any, run_id: str, cfg: ExperimentConfig, facts: dict[str, str]) -> None:
    """The run's params: the flattened config, and ``facts`` (:func:`federation_facts`) as ``federation.*``;
    sorted, each cut at :data:`PARAM_LENGTH` characters."""
    from mlflow.entities import Param  # MLflow only when a run is logged

    params = {k: str(v) for k, v in flatten(cfg).items()}
    params.update({f"federation.{k}": str(v) for k, v in facts.items()})
    items = [Param(k, v[:PARAM_LENGTH]) for k, v in sorted(params.items())]
    for start in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + PARAMS_PER_BATCH])


def _partition_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """The ``data`` section but where its files live (which does not change the samples)."""
    return {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in ("data_dir", "download")}


def partition_digest(cfg: ExperimentConfig) -> str:
    """What decides the devices' samples (the ``data`` section but where files live, and the seed),
    hashed: equal digests, equal partitions."""
    data = _partition_config(cfg)
    drop_later_defaults({"data": data})  # digests of runs without a validation split stay as they were
    blob = json.dumps({"data": data, "seed": cfg.seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def dataset_input(cfg: ExperimentConfig, fed: Federation) -> Any:
    """The run's dataset as an MLflow dataset input (no data uploaded): name = the dataset (``file:NAME`` for
    ``data.dataset: file``), digest = :func:`partition_digest`, source = the data directory or the file (MLflow's
    ``local`` source), profile = the partition's config and
    statistics; context ``training`` (each device's train and test split come from it)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag  # MLflow only when a run is logged

    # a file dataset is its file (named by it); a built-in one its name, read from the data directory
    data_dir = Path(cfg.data.data_dir).expanduser()
    source = file_source(cfg)
    where = str((source.resolve(data_dir) if source is not None else data_dir).resolve())
    name = f"file:{Path(where).name}" if source is not None else cfg.data.dataset
    profile = {"partition": _partition_config(cfg),
               "seed": cfg.seed, "num_devices": fed.num_devices, "train_samples": int(fed.train_sizes.sum()),
               "num_classes": fed.num_classes, "input_shape": list(fed.input_shape),
               "stats": {k: float(v) for k, v in fed.partition_stats.items()}}
    entity = Dataset(name=name, digest=partition_digest(cfg), source_type="local",
                     source=json.dumps({"uri": where}), profile=json.dumps(profile, default=str))
    return DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")])


def log_dataset(client: Any, run_id: str, dataset: Any, attempts: int = 5) -> None:
    """``client.log_inputs`` that survives concurrent runs of one experiment logging the same dataset: the
    store looks the dataset up, then inserts it, so all but one racer hit the UNIQUE constraint; again,
    they find the row."""
    from mlflow.exceptions import MlflowException  # MLflow only when a run is logged

    for attempt in range(attempts):
        try:
            client.log_inputs(run_id, datasets=[dataset])
            return
        except MlflowException as exc:
            duplicate = any(k in str(exc) for k in ("UNIQUE constraint", "IntegrityError", "Duplicate entry",
                                                     "duplicate key"))
            if not duplicate or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
