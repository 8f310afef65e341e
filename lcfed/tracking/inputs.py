"""What went into a run: its params (the config's fields that apply to it, the resolved store and the
federation's facts, ``federation.*``), the whole config as ``config.yaml``, and its dataset input (a
digest of the partition, its config and statistics).

Separate from the observer because the sweep's trials compute the facts on worker nodes (no MLflow
there) and report them to the driver, and because the partition digest (equal digests, equal devices'
samples) is a pure function of the config that needs no store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lcfed.config import ExperimentConfig, drop_later_defaults, flatten, to_dict
from lcfed.config.privacy import PrivacyConfig
from lcfed.data.generated import GENERATED
from lcfed.methods.round import Federation
from lcfed.run.sources import file_source


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


Rule = Callable[[ExperimentConfig], bool]


def _partition(*names: str) -> Rule:
    return lambda c: c.data.partition in names


def _dataset(*names: str) -> Rule:
    return lambda c: c.data.dataset in names


def _simulated(rule: Rule = lambda c: True) -> Rule:
    return lambda c: bool(c.devices.simulate) and rule(c)


def _availability(*names: str) -> Rule:
    return _simulated(lambda c: c.devices.availability in names)


def _aggregation(name: str) -> Rule:
    return _simulated(lambda c: c.devices.aggregation == name)


def _ray(c: ExperimentConfig) -> bool:
    return c.engine.kind == "ray"


#: fields logged as params only where they apply: a Dirichlet run's params say nothing of classes per
#: device, an in-process run's nothing of actors (the whole config is the run's ``config.yaml``)
APPLIES: dict[str, Rule] = {
    "data.alpha": _partition("dirichlet"),
    "data.dirichlet_convention": _partition("dirichlet"),
    "data.classes_per_device": _partition("pathological"),
    "data.primary": _partition("primary_secondary"),
    "data.secondary": _partition("primary_secondary"),
    "data.user_selection": _partition("natural"),
    "data.testbed_groups": lambda c: c.data.testbed != "none",
    **{f"data.{f}": _dataset("file") for f in ("path", "format", "label_column", "device_column", "group_column",
                                               "image_size")},
    "data.synthetic_samples": _dataset("synthetic", GENERATED),
    **{f"data.{f}": _dataset(GENERATED) for f in ("synthetic_alpha", "synthetic_beta", "synthetic_clusters")},
    "data.download": lambda c: c.data.dataset != "file",
    **{f"devices.{f}": _simulated() for f in ("speed_sigma", "bandwidth_sigma", "latency_ms", "availability",
                                              "dropout", "capacity_trace", "target_acc", "aggregation")},
    "devices.online_fraction": _availability("diurnal", "iid"),
    "devices.period_hours": _availability("diurnal", "iid"),
    "devices.slot_minutes": _availability("iid"),
    "devices.phase": _availability("diurnal"),
    "devices.phase_jitter": _simulated(lambda c: c.devices.availability == "diurnal" and c.devices.phase == "groups"),
    "devices.availability_trace": _availability("trace"),
    "devices.trace_format": _simulated(lambda c: bool(c.devices.capacity_trace or c.devices.availability_trace)),
    "devices.deadline_seconds": _aggregation("sync"),
    "devices.overcommit": _aggregation("sync"),
    "devices.async_buffer": _aggregation("async"),
    "devices.staleness": _aggregation("async"),
    **{f"engine.{f}": _ray for f in ("num_actors", "devices_per_actor", "cpus_per_actor", "gpus_per_actor", "gpus",
                                     "actors_per_gpu", "placement_timeout_s", "address", "object_store_mb",
                                     "max_failures", "data_reads")},
    "engine.spill_dir": lambda c: c.engine.state_memory_mb > 0,
    "checkpoint.every": lambda c: bool(c.checkpoint.dir),
    "tracking.enabled": lambda c: False,  # a logged run is tracked
    # the run's name is the run's (and config.yaml has it): as a param each trial's own value was an axis of
    # the UI's parallel-coordinates plot of a sweep
    "tracking.run_name": lambda c: False,
    # the privacy section's settings only for a private run (its mode says it is not one); DP-SGD's with it on
    **{f"privacy.{f.name}": (lambda c: c.privacy.on) for f in dataclasses.fields(PrivacyConfig)
       if f.name != "mode" and not f.name.startswith("sample_")},
    **{f"privacy.{f.name}": (lambda c: c.privacy.sample_on) for f in dataclasses.fields(PrivacyConfig)
       if f.name.startswith("sample_")},
}


def applicable(cfg: ExperimentConfig) -> dict[str, Any]:
    """The flattened config's fields that apply to this run (:data:`APPLIES`), unset ones (None, "", ())
    left out: ``train.local_epochs`` when the budget is in steps, ``tracking.run_name`` when not given."""
    return {k: v for k, v in flatten(cfg).items()
            if APPLIES.get(k, lambda c: True)(cfg) and v is not None and v != "" and v != ()}


def run_params(cfg: ExperimentConfig, facts: dict[str, str], uri: str) -> dict[str, str]:
    """A run's params: :func:`applicable`, ``tracking.uri`` as resolved (the store the run went to), and
    ``facts`` (:func:`federation_facts`) as ``federation.*``; sorted, each cut at :data:`PARAM_LENGTH`."""
    params = {k: str(v) for k, v in applicable(cfg).items()}
    params["tracking.uri"] = uri
    params.update({f"federation.{k}": str(v) for k, v in facts.items()})
    return {k: v[:PARAM_LENGTH] for k, v in sorted(params.items())}


def log_params(client: Any, run_id: str, cfg: ExperimentConfig, facts: dict[str, str], uri: str) -> None:
    """The run's params (:func:`run_params`) and its whole config as the artifact ``config.yaml`` (what
    ``lcfed run -c`` reads back)."""
    from mlflow.entities import Param  # MLflow only when a run is logged

    items = [Param(k, v) for k, v in run_params(cfg, facts, uri).items()]
    for start in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + PARAMS_PER_BATCH])
    client.log_text(run_id, yaml.safe_dump(to_dict(cfg), sort_keys=False), "config.yaml")


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
