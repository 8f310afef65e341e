"""Every per-round metric a run reports, in one place: its name, better direction, run-page section, when it
exists, and whether ``lcfed run``'s summary averages it, the accuracy plot draws it and a sweep may optimise it.

``lcfed run``'s summary, ``lcfed sweep --metric``, the MLflow sections, the accuracy figure and the docs'
metric table are all read from :data:`CATALOG`; adding a metric is one row here (and the code that computes
it). Standard library only: Tune workers and the CLI's parser import it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "FAMILIES", "LAYER_FAMILIES", "Metric", "PLOTTED", "SECTIONS", "SUMMARY", "SUMMARY_AVERAGED", "objectives",
           "docs_table", "order_key"]

#: MLflow's run page shows one section per metric-key prefix, sorted by name: these read accuracy, loss,
#: server, time, traffic (:mod:`lcfed.tracking.naming` prefixes each key with its metric's section)
SECTIONS = ("accuracy", "loss", "server", "time", "traffic")


@dataclass(frozen=True)
class Metric:
    """One per-round metric."""

    name: str
    section: str  # one of SECTIONS
    direction: str | None  # "max" / "min": the better way; None: none (a sweep on it must give --mode)
    doc: str  # what it is, one line (the docs' table)
    when: str = "every round"  # when a run reports it
    summary: bool = False  # in ``lcfed run``'s summary: the last evaluation and the mean of the last N
    plotted: bool = False  # drawn in the accuracy-vs-round figure
    objective: bool = True  # a ``lcfed sweep --metric`` / Tune result
    averaged: bool = True  # the summary's mean of the last N: not for a running total such as ε spent


_EVAL = "evaluation rounds (`train.eval_every`)"
_CLUSTERED = "clustered methods"
_DEVICES = "with a device model (`devices` section)"
_PRIVACY = "with `privacy.mode: central` ([Privacy](privacy.md))"

CATALOG: tuple[Metric, ...] = (
    Metric("acc_mean", "accuracy", "max", "mean test accuracy over the devices that have trained", _EVAL,
           summary=True, plotted=True),
    Metric("acc_weighted", "accuracy", "max", "test accuracy weighted by the devices' test samples", _EVAL,
           summary=True, plotted=True),
    Metric("acc_std", "accuracy", "min", "standard deviation of the devices' test accuracies", _EVAL, summary=True),
    Metric("acc_p10", "accuracy", "max", "10th percentile of the devices' test accuracies", _EVAL,
           summary=True, plotted=True),
    Metric("acc_p90", "accuracy", "max", "90th percentile of the devices' test accuracies", _EVAL,
           summary=True, plotted=True),
    Metric("acc_mean_ci95", "accuracy", None, "half-width of `acc_mean`'s 95 % interval (`acc_mean` ± it) when "
           "the evaluation scored a seeded sample of the trained devices",
           "evaluations of a sample (`train.eval_devices`, `train.final_eval_devices`)", objective=False),
    Metric("val_acc_mean", "accuracy", "max", "`acc_mean` on the validation split: tune on it", _EVAL + " with `data.val_fraction`"),
    Metric("val_acc_weighted", "accuracy", "max", "`acc_weighted` on the validation split",
           _EVAL + " with `data.val_fraction`"),
    Metric("acc_new_mean", "accuracy", "max", "held-out devices' mean test accuracy once they join",
           "the last round with `data.holdout_fraction`"),
    Metric("acc_new_weighted", "accuracy", "max", "held-out devices' sample-weighted test accuracy",
           "the last round with `data.holdout_fraction`"),
    Metric("test_loss", "loss", "min", "test loss, sample-weighted", _EVAL, summary=True),
    Metric("train_loss", "loss", "min", "the participants' training loss, sample-weighted", summary=True),
    Metric("val_loss", "loss", "min", "loss on the validation split", _EVAL + " with `data.val_fraction`"),
    Metric("label_homogeneity", "server", "max", "share of the label distributions' spread the clusters explain",
           _CLUSTERED, summary=True),
    Metric("ari", "server", "max", "adjusted Rand index of the clusters against the true groups",
           _CLUSTERED + " where K clusters can express the groups", summary=True),
    Metric("nmi", "server", "max", "normalized mutual information against a testbed's true groups",
           _CLUSTERED + " on a testbed (`data.testbed`)", summary=True, objective=False),
    Metric("num_clusters", "server", None, "clusters in use", _CLUSTERED, summary=True),
    Metric("coverage", "server", "max", "share of the training devices that have trained", summary=True),
    Metric("round_seconds", "time", "min", "wall-clock seconds of the round on this machine"),
    Metric("sim_comm_seconds", "time", "min", "the round's transfer time: an average participant's bytes over "
           "`network.bandwidth_mbps`"),
    Metric("sim_compute_seconds", "time", "min", "the round's local training: 3 × forward FLOPs (counted by "
           "torch) per training sample at `network.device_gflops`"),
    Metric("sim_seconds_total", "time", "min", "running sum of `sim_comm_seconds` + `sim_compute_seconds`"),
    Metric("sim_clock_seconds", "time", "min", "the simulated clock at the round's end", _DEVICES),
    Metric("sim_seconds_to_target", "time", "min", "the simulated clock when `acc_mean` first reached "
           "`devices.target_acc`", "once, with a device model and `devices.target_acc`"),
    Metric("sim_round_seconds", "time", "min", "the round's simulated duration (its kept devices' time)", _DEVICES),
    Metric("devices_online", "server", None, "training devices online when the round started", _DEVICES),
    Metric("devices_selected", "server", None, "devices the round selected (with over-commitment)", _DEVICES),
    Metric("devices_kept", "server", "max", "selected devices whose work the methods received", _DEVICES),
    Metric("devices_dropped", "server", "min", "selected devices lost: dropped out, offline, late or over the quota",
           _DEVICES),
    Metric("staleness_mean", "server", "min", "mean staleness (server versions) of the aggregated updates",
           "with a device model, `devices.aggregation: async`"),
    Metric("dp_epsilon", "server", "min", "ε of client-level DP spent so far, at `dp_delta` (dp-accounting's RDP, "
           "composed over the rounds' sampling rates)", _PRIVACY, summary=True, averaged=False),
    Metric("dp_delta", "server", None, "the δ that `dp_epsilon` is at (`privacy.delta`)", _PRIVACY, objective=False),
    Metric("dp_sampling_rate", "server", None, "the round's sampling rate: the cohort over the training devices; with "
           "a device model, the selected over those online", _PRIVACY, objective=False),
    Metric("dp_noise_multiplier", "server", None, "σ of each sum's noise (given, or solved for `privacy.target_epsilon`)",
           _PRIVACY, objective=False),
    Metric("dp_clip", "server", None, "the round's clip C under adaptive clipping (it tracks the `privacy.clip_quantile` "
           "of update norms)", "with `privacy.clip_quantile` ([Privacy](privacy.md#adaptive-clipping))", objective=False),
    Metric("dp_clip_fraction", "server", None, "the noised fraction of the round's updates within `dp_clip` (b̄), "
           "which moves the next round's clip", "with `privacy.clip_quantile`, when a device was kept", objective=False),
    Metric("dp_sample_epsilon", "server", "min", "sample-level DP-SGD: the worst device's ε so far at `dp_sample_delta`, "
           "every round counted for every device", "with `privacy.sample_noise` ([Privacy](privacy.md#sample-level-dp-sgd))",
           averaged=False),
    Metric("dp_sample_delta", "server", None, "the δ that `dp_sample_epsilon` is at (`privacy.sample_delta`, or the "
           "smallest device's n^-1.1)", "with `privacy.sample_noise`", objective=False),
    Metric("bytes_up", "traffic", "min", "bytes the round's devices uploaded"),
    Metric("bytes_down", "traffic", "min", "bytes the round's devices downloaded"),
    Metric("bytes_up_total", "traffic", "min", "running sum of `bytes_up`"),
    Metric("bytes_down_total", "traffic", "min", "running sum of `bytes_down`"),
)

_LAYERS = ("every round, in MLflow as the table `traffic/layers.csv` and the chart `plots/traffic_layers.png`, "
           "not as metrics")

#: metric families, one key per member: (prefix, section, when, what a member is)
FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("bytes_up/", "traffic", _LAYERS, "bytes uploaded per model layer (`conv1`…`fc3`; codes and projections "
     "under `other`)"),
    ("bytes_down/", "traffic", _LAYERS, "bytes downloaded per model layer"),
    ("cluster_size_", "server", _CLUSTERED + ", in MLflow", "devices in cluster `<k>`"),
)

#: the per-layer traffic families: the same bytes every round for most methods, so MLflow gets them as one
#: table and one chart at the end of a run (flat per-round lines, one chart per layer, said nothing)
LAYER_FAMILIES = ("bytes_up/", "bytes_down/")

_BY_NAME = {m.name: m for m in CATALOG}
_RANK = {m.name: i for i, m in enumerate(CATALOG)}


def order_key(name: str) -> tuple[int, int, str]:
    """Sorts metric names as a run page should read them: by section (:data:`SECTIONS`), then as the
    catalogue lists them, families and unknown names last in their section. MLflow's run overview lists a
    run's metrics in the order they were first logged."""
    where = section_of(name)
    rank = SECTIONS.index(where) if where in SECTIONS else len(SECTIONS)
    return rank, _RANK.get(name, len(CATALOG)), name


def section_of(name: str) -> str | None:
    """The section of ``name``: its entry's, its family's, None for a name of neither."""
    entry = _BY_NAME.get(name)
    if entry is not None:
        return entry.section
    return next((section for prefix, section, _, _ in FAMILIES if name.startswith(prefix)), None)


def objectives() -> dict[str, str | None]:
    """What ``lcfed sweep --metric`` takes: each name to its natural ``--mode`` (None: must be given)."""
    return {m.name: m.direction for m in CATALOG if m.objective}


#: what ``lcfed run``'s summary reports, per evaluation and averaged over the last ``tracking.summary_evals``
SUMMARY = tuple(m.name for m in CATALOG if m.summary)

#: the summary metrics whose mean of the last N evaluations means something (not ε, which only grows)
SUMMARY_AVERAGED = tuple(m.name for m in CATALOG if m.summary and m.averaged)

#: what the accuracy-vs-round figure draws
PLOTTED = tuple(m.name for m in CATALOG if m.plotted)


def docs_table() -> str:
    """docs/mlflow.md's metric table (a test keeps the page equal to it)."""
    rows = ["| metric | section | better | reported | what it is |", "|---|---|---|---|---|"]
    for m in CATALOG:
        flags = [f for f, on in (("summary", m.summary), ("plotted", m.plotted), ("not a --metric", not m.objective))
                 if on]
        when = m.when + (f" ({', '.join(flags)})" if flags else "")
        rows.append(f"| `{m.name}` | `{m.section}/` | {m.direction or '—'} | {when} | {m.doc} |")
    for prefix, section, when, doc in FAMILIES:
        rows.append(f"| `{prefix}<…>` | `{section}/` | — | {when} (not a --metric) | {doc} |")
    return "\n".join(rows)
