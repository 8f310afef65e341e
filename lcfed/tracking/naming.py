"""What things are called in MLflow: a run's default name (what ran, readable in the runs table) and the
key each per-round metric is logged under (its section on a run page).

Separate from the observer because sweeps, comparisons, the Python API and the tests name runs and read
metrics by these rules too. Standard library only: Tune trials import ``lcfed.tracking``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from lcfed.run.metric_catalog import SECTIONS, section_of

#: what separates a name's parts: the method and its values, the data, the seed
SEP = " · "

#: override prefixes a name leaves out: where and how a run executes and is logged, not what it computes
#: (the engines give the same numbers; the engine is a tag)
UNNAMED_PREFIXES = ("engine.", "tracking.", "checkpoint.")

#: override keys a name shows in its data or seed part, or as the method itself
NAMED_ELSEWHERE = frozenset({"name", "seed", "method.name", "data.dataset", "data.path", "data.partition",
                             "data.alpha", "data.classes_per_device", "data.testbed", "data.testbed_groups"})


def section(name: str) -> str | None:
    """The run-page section of the per-round metric ``name`` (:data:`~lcfed.run.metric_catalog.SECTIONS`, from the
    metric catalogue), None for a name of no section. ``best_<metric>`` (a sweep's parent run) goes with
    ``<metric>``."""
    return section_of(name.removeprefix("best_"))


def mlflow_key(name: str) -> str:
    """The MLflow key of the per-round metric ``name``: ``<section>/<name>`` (``accuracy/acc_mean``,
    ``traffic/bytes_up/conv1``), so the chart keeps the metric's own name as its title; ``name`` as it is
    when it has no section."""
    where = section(name)
    return f"{where}/{name}" if where else name


def metric_name(key: str) -> str:
    """The inverse of :func:`mlflow_key`: ``accuracy/acc_mean`` -> ``acc_mean``."""
    head, sep, rest = key.partition("/")
    return rest if sep and head in SECTIONS and section(rest) == head else key


def short_names(keys: Sequence[str]) -> list[str]:
    """``method.mu`` -> ``mu`` unless two keys share their last part."""
    tails = [k.split(".")[-1] for k in keys]
    return [t if tails.count(t) == 1 else k for k, t in zip(keys, tails, strict=True)]


def short_value(v: Any) -> str:
    """A value as a name shows it: floats to 3 significant digits (``0.0312``, ``1e-05``)."""
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def values_label(values: Mapping[str, Any]) -> str:
    """``mu=0.0312 lam=0.2``: each value, named by the last part of its key ("" for none)."""
    keys = short_names(list(values))
    return " ".join(f"{k}={short_value(v)}" for k, v in zip(keys, values.values(), strict=True))


def method_label(method: str, values: Mapping[str, Any]) -> str:
    """``lcfed mu=0.0312 lam=0.2``: the method and each value (:func:`values_label`)."""
    label = values_label(values)
    return f"{method} {label}" if label else method


def fit_name(name: str) -> str:
    """``name`` within MLflow's 250 characters for a run name (cut with an ellipsis)."""
    return name if len(name) <= 250 else name[:249] + "…"


def data_label(cfg: Any) -> str:
    """``digits dir0.15``: the dataset and its partition (Dirichlet α, classes per device, ...), with the
    testbed and its number of groups where one is set."""
    d = cfg.data
    dataset = (PurePath(d.path).stem or "file") if d.dataset == "file" else str(d.dataset).rsplit(":", 1)[-1]
    part = {"dirichlet": f"dir{d.alpha:g}", "pathological": f"path{d.classes_per_device}",
            "primary_secondary": "primsec"}.get(d.partition, d.partition)
    testbed = f" {d.testbed}{d.testbed_groups}" if d.testbed != "none" else ""
    return f"{dataset} {part}{testbed}"


#: the ``devices.*`` keys the device-model part of a name shows (:func:`devices_label`)
DEVICES_NAMED = frozenset({"devices.simulate", "devices.aggregation", "devices.async_buffer", "devices.deadline_seconds",
                           "devices.overcommit", "devices.availability"})


def devices_label(cfg: Any) -> str:
    """The device model's part of a name: ``FedBuff B=4`` (asynchronous), ``sync deadline 60s over 0.3`` (rounds that
    wait, with their policies), and the availability unless always online; "" with the device model off."""
    d = getattr(cfg, "devices", None)
    if d is None or not d.simulate:
        return ""
    if d.aggregation == "async":
        parts = [f"FedBuff B={d.async_buffer}"]
    else:
        parts = ["sync"]
        if d.deadline_seconds > 0:
            parts.append(f"deadline {d.deadline_seconds:g}s")
        if d.overcommit > 0:
            parts.append(f"over {d.overcommit:g}")
    if d.availability != "always":
        parts.append(d.availability)
    return " ".join(parts)


def named_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``values`` (dotted config keys, e.g. ``--set`` overrides) a run's name shows: not those its other
    parts show (:data:`NAMED_ELSEWHERE`) nor where it runs and logs (:data:`UNNAMED_PREFIXES`)."""
    return {k: v for k, v in values.items()
            if k not in NAMED_ELSEWHERE and k not in DEVICES_NAMED and not k.startswith(UNNAMED_PREFIXES)}


def run_name(cfg: Any, values: Mapping[str, Any] | None = None) -> str:
    """A run's default name: ``lcfed mu=1 lam=0.1 · digits dir0.15 · s0``, the method, the ``values`` set
    for it (:func:`named_values`), the data, the device model when it is on (``FedBuff B=4``,
    :func:`devices_label`) and the seed; at most 250 characters (MLflow's limit)."""
    devices = devices_label(cfg)
    return fit_name(SEP.join([method_label(cfg.method.name, named_values(values or {})), data_label(cfg),
                              *([devices] if devices else []), f"s{cfg.seed}"]))
