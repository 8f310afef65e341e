"""``lcfed compare``: methods tuned on one budget, then re-run on several seeds, with statistics.

Phase 1 tunes every method with a Ray Tune sweep over its own bundled space (``tune_jobs/spaces/compare``,
or ``--space-dir``), the same number of trials and rounds for each, choosing by **validation**
accuracy (``val_acc_mean``: each device's validation split, ``data.val_fraction``); test data decides
nothing. Phase 2 re-runs each method's chosen config on ``--seeds`` seeds (each seed: another partition
and initialization), as a second sweep (a grid over ``seed``), and reports test accuracy: per method
the mean with its 95 % Student-t interval over seeds, and the paired difference (same seeds) against
Standalone and against the best other method with a paired t-test and a Wilcoxon signed-rank test.

Every sweep is a nested MLflow run under one ``compare`` parent run (the parent of its trials' runs);
``compare.md`` / ``compare.csv`` / plots go to ``--out`` and onto the parent. Untracked (``--no-track`` or
``tracking.enabled=false``) there are no runs: the report is read from Tune's results and goes to ``--out``.
A phase's result is written to ``<out>/phase1|phase2/<method>.json`` when it ends and never redone, and an
interrupted sweep resumes from Tune's state: rerun the same command to continue. Methods run side by side
(``--parallel``, default 4), each by its own driver process on the comparison's Ray: :mod:`tune_jobs.compare_drivers`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from lcfed import registry
from lcfed.config import ExperimentConfig, load_config
from lcfed.config.overrides import resolve
from lcfed.errors import require
from lcfed.run.output_paths import check_output_dir
from lcfed.tracking import check_tracking_store, resolve_tracking_uri
from tune_jobs.compare_report import METRIC, write_report
from tune_jobs.options import config_options, examples, verbosity_options
from tune_jobs.outdir import open_recorded, read_state, write_json
from tune_jobs.parent_run import ParentRun
from tune_jobs.reproduce import parse_seeds, summarize
from tune_jobs.sweep.options import (
    SweepOptions,
    add_no_track,
    add_sweep_options,
    check_storage,
    storage_location,
    sweep_options,
    tracking_of,
)

COMPARE_SPACES = Path(__file__).resolve().parent / "spaces" / "compare"
#: ``lcfed compare``'s wording of the sweep options it offers (:func:`add_sweep_options`), where it differs
COMPARE_HELP = {
    "search": "phase-1 search (as lcfed sweep --search; default random)",
    "scheduler": "phase-1 scheduler (as lcfed sweep; default asha)",
    "gpus_per_trial": "GPUs per trial",
    "storage": "Tune storage (default <out>/tune; a URI every node reaches on a cluster)",
    "name": "MLflow parent run and sweep names (default: the --out directory's name)",
    "register": "register the model of the best method's best phase-2 trial in the MLflow Model Registry as a new "
    "version of NAME, linked to its run",
}
#: the validation share of each device's training samples when the base config has none
DEFAULT_VAL_FRACTION = 0.2
#: a method's phases, each a sweep whose result is ``<out>/<phase>/<method>.json`` (:func:`phase_file`)
PHASES = ("phase1", "phase2")
#: methods run side by side by default (``--parallel``), a driver process each
DEFAULT_PARALLEL = 4


def space_names(method: str) -> list[str]:
    """The file names a method's space may have in a spaces directory: ``<method>.yaml``; for a method given as
    ``module:Class``, ``<Class>.yaml`` first (a colon has no place in a portable file name)."""
    names = [f"{method}.yaml"]
    if ":" in method:
        names.insert(0, f"{method.rpartition(':')[2]}.yaml")
    return names


def shipped_space(strategy: type) -> Path | None:
    """The YAML a strategy names as its ``compare_space``: an absolute path, or one relative to the directory of
    the strategy's module (not the working directory: the plugin's files travel with it)."""
    shipped = getattr(strategy, "compare_space", None)
    if shipped is None:
        return None
    path = Path(shipped)
    if not path.is_absolute():
        path = Path(inspect.getfile(strategy)).resolve().parent / path
    return path


def method_space(method: str, space_dir: str | Path | None) -> Path:
    """``<space_dir>/<method>.yaml`` (``<Class>.yaml`` for a ``module:Class`` method); default: the bundled compare
    spaces, then the space a method ships as its strategy's ``compare_space`` (:func:`shipped_space`)."""
    where = Path(space_dir) if space_dir is not None else COMPARE_SPACES
    candidates = [where / name for name in space_names(method)]
    path = next((p for p in candidates if p.is_file()), candidates[-1])
    shipped = shipped_space(registry.method(method).strategy)
    if space_dir is None and not path.is_file() and shipped is not None:
        require(shipped.is_file(), "--methods", method, f"its strategy's compare_space names {shipped}, which is not a "
                "file (a relative path is read next to the strategy's module)")
        return shipped
    if space_dir is not None:
        require(path.is_file(), "--methods", method,
                f"has no search space in --space-dir: write {' or '.join(str(p) for p in candidates)}")
    bundled = sorted(p.stem for p in COMPARE_SPACES.glob("*.yaml"))
    require(path.is_file(), "--methods", method,
            f"method {method} has no search space among the built-in ones ({', '.join(bundled)}): give its "
            "strategy a compare_space attribute (a search-space YAML's path, relative to its module's directory) or "
            f"pass --space-dir DIR with DIR/{space_names(method)[0]}")
    return path


def method_config(base: ExperimentConfig, method: str, val_fraction: float) -> ExperimentConfig:
    """The base config for ``method`` (settings the method shares with the base method carried over)."""
    return base.replace(**{"method.name": method, "data.val_fraction": val_fraction})


def _seed_rows(grid: Any) -> dict[int, dict[str, Any]]:
    """Per seed: the summary of its run (test accuracy over the last evaluations) and its curve."""
    rows: dict[int, dict[str, Any]] = {}
    for r in grid:
        if r.error is not None:
            raise RuntimeError(f"a phase-2 run failed: {r.error}")
        df = r.metrics_dataframe
        prefix = "lcfed/metrics/"
        cols = [c for c in df.columns if c.startswith(prefix)]
        history = [{c[len(prefix):]: float(v) for c, v in row.items() if isinstance(v, (int, float)) and not
                    (isinstance(v, float) and math.isnan(v))} for row in df[cols].to_dict("records")]
        history = [h for h in history if "round" in h]
        curve = [[h["round"], h["acc_mean"], h.get("bytes_up_total", 0.0) + h.get("bytes_down_total", 0.0),
                  # the device model's clock where it runs (devices.simulate), else the ideal round's pricing
                  h.get("sim_clock_seconds", h.get("sim_seconds_total", math.nan))] for h in history if "acc_mean" in h]
        # the assignment against a testbed's true groups, each round a method clustered
        recovery = [[h["round"], h.get("ari", math.nan), h.get("nmi", math.nan), h["num_clusters"]]
                    for h in history if "num_clusters" in h]
        last = (r.metrics or {}).get("lcfed") or {}
        devices = json.loads(last.get("devices") or "{}")
        rows[int(r.config["seed"])] = {**summarize(history), "curve": curve, "recovery": recovery, "devices": devices,
                                       "provenance": last.get("provenance") or {},
                                       "val_acc_mean": float(history[-1].get("val_acc_mean", math.nan)),
                                       "acc_new_mean": float(history[-1].get("acc_new_mean", math.nan)),
                                       # privacy.mode: central's (ε, δ) at the end; nan without privacy
                                       "dp_epsilon": float(history[-1].get("dp_epsilon", math.nan)),
                                       "dp_delta": float(history[-1].get("dp_delta", math.nan))}
    return rows


@dataclass(frozen=True)
class ComparePlan:
    """A comparison's settings, resolved and checked before anything starts: what both phases' sweeps run."""

    base: ExperimentConfig
    methods: tuple[str, ...]
    out: Path
    configs: dict[str, ExperimentConfig]  # per method: the base config for it (:func:`method_config`)
    spaces: dict[str, Any]  # per method: its phase-1 search space
    params: dict[str, str]  # the comparison's settings (the parent run's params, ``<out>/state.json``'s)
    options: SweepOptions  # the sweeps' shared options: name and storage resolved, validated
    budget: int
    seeds: tuple[int, ...]
    target: float | None
    parallel: int = 1  # methods run side by side, a driver process each (:mod:`tune_jobs.compare_drivers`)

    @property
    def name(self) -> str:
        return str(self.options.name)

    def sweep_name(self, method: str, phase: str) -> str:
        """``<name>-<method>-tune|seeds``: a phase's sweep (a plugin path's ':' as '-': the name is a directory)."""
        return f"{self.name}-{re.sub(r'[^A-Za-z0-9._-]', '-', method)}-{phase}"

    def tuning(self, method: str) -> SweepOptions:
        """Phase 1's sweep of ``method``: ``budget`` trials on :data:`METRIC`, resumed if interrupted; its
        trials log no models (the models that matter are phase 2's)."""
        return replace(self.options, num_samples=self.budget, name=self.sweep_name(method, "tune"), resume=True,
                       register=None, log_models=False)

    def seeding(self, method: str) -> SweepOptions:
        """Phase 2's sweep of ``method``: a grid over the seeds, every trial run to the end (fifo), the best
        trial's models logged."""
        return replace(self.options, num_samples=1, search="random", scheduler="fifo", grace_period=None, max_t=None,
                       name=self.sweep_name(method, "seeds"), resume=True, register=None, log_models=True)


def run_compare(base: ExperimentConfig, methods: Sequence[str], out: str | Path, options: SweepOptions, *,
                budget: int = 8, seeds: Sequence[int] = (0, 1, 2), space_dir: str | Path | None = None,
                target: float | None = None, parallel: int = DEFAULT_PARALLEL) -> dict[str, Any]:
    """Both phases for every method (what is on disk already is kept), then the report.

    ``options``: what every sweep of the comparison shares (``search``, ``scheduler``, ``grace_period`` and
    ``max_t``: phase 1's; ``max_concurrent``, ``gpus_per_trial``, ``trial_engine``, ``storage``: default
    ``<out>/tune``, and ``keep_checkpoints``: both phases', as ``lcfed sweep``), besides ``name`` (the
    comparison's, default the ``out`` directory's name; its sweeps are ``<name>-<method>-tune|seeds``) and
    ``register`` (the best method's best phase-2 trial's model is registered under that name, as ``lcfed
    sweep --register``). The comparison decides its sweeps' metric (:data:`METRIC`), trial counts
    (``budget``; one per seed), resume and models itself (:meth:`ComparePlan.tuning`, :meth:`ComparePlan.seeding`).
    With ``base.tracking.enabled`` false nothing is logged to MLflow (``register`` is refused). ``parallel``: how many
    methods run at once, each by its own driver process attached to this one's Ray (:mod:`tune_jobs.compare_drivers`;
    their sweeps overlap, so a trial process starts while another trains); 1, or one method left to run: one after
    the other in this process.
    """
    # Tune loads when a comparison runs, not with lcfed's parser (which imports this module)
    from tune_jobs.sweep.search import check_search
    from tune_jobs.sweep.space import load_space
    from tune_jobs.sweep.trial import load_sources

    out = Path(out)
    require(len(methods) >= 2 and len(set(methods)) == len(methods), "--methods", ",".join(methods),
            "at least two distinct methods")
    for m in methods:
        resolve("method", "--methods", m)
    require(budget >= 1, "--budget", budget, "trials per method, >= 1")
    require(len(seeds) >= 1, "--seeds", list(seeds), ">= 1 seed")
    require(target is None or 0 < target <= 1, "--target", target, "an accuracy in (0, 1]")
    require(isinstance(parallel, int) and parallel >= 1, "--parallel", parallel, "methods run at once, >= 1")
    storage = options.storage or str(out.resolve() / "tune")
    options = replace(options, name=options.name or (out.name or "compare"), storage=storage, metric=METRIC,
                      mode=None)
    tracked = base.tracking.enabled
    options.validate(base.train.rounds, tracked)
    val_fraction = base.data.val_fraction or DEFAULT_VAL_FRACTION
    configs = {m: method_config(base, m, val_fraction) for m in methods}
    spaces = {m: load_space(method_space(m, space_dir), configs[m]) for m in methods}  # validated before work
    for m in methods:
        check_search(options.search, spaces[m])
    for s in seeds:
        base.replace(seed=s)
    params = {"methods": ",".join(methods), "budget": str(budget), "seeds": ",".join(map(str, seeds)),
              "search": options.search, "scheduler": options.scheduler, "metric": METRIC,
              "val_fraction": str(val_fraction), "rounds": str(base.train.rounds), "base_digest": base.digest(),
              "name": str(options.name), **({} if tracked else {"tracking": "off"})}
    plan = ComparePlan(base=base, methods=tuple(methods), out=out, configs=configs, spaces=spaces, params=params,
                       options=options, budget=budget, seeds=tuple(seeds), target=target, parallel=parallel)
    for m in methods:  # each sweep's own options (its name holds the method's), before any work
        plan.tuning(m).validate(base.train.rounds)
        plan.seeding(m).validate(base.train.rounds)
    load_sources(configs[methods[0]], {})  # a missing dataset fails here, before any run or file exists
    state = read_state(out, params, "a comparison")  # other settings are refused before Ray starts
    # a rerun of a finished comparison only writes the report again: no sweep, so no Ray to start
    todo = [m for m in methods if not all(phase_file(out, p, m).exists() for p in PHASES)]
    finished = state is not None and not todo
    side_by_side = parallel > 1 and len(todo) > 1
    if side_by_side:
        from tune_jobs.compare_drivers import prestart

        prestart()  # the drivers' imports, while Ray starts
    uri = resolve_tracking_uri(base.tracking.uri) if tracked else None
    with ParentRun(base.engine, uri, "; rerun the same command to resume", ray=not finished) as parent:
        if not finished:  # a multi-node cluster needs a storage every node reaches
            check_storage(storage_location(storage))
        return _run_phases(parent, plan, state, todo, side_by_side)


def _run_phases(parent: ParentRun, plan: ComparePlan, state: dict[str, Any] | None, todo: list[str],
                side_by_side: bool) -> dict[str, Any]:
    """Under the comparison's parent run (the plan's ``params``; ``state``: what ``<out>/state.json``
    recorded), phase 1 then phase 2 of every method not finished before (``todo``; :func:`run_method`, with
    ``side_by_side`` ``plan.parallel`` of them at once by driver processes), then the report, also on the parent run (untracked, ``parent.uri`` None: no parent run;
    ``state.json`` records the settings alone)."""
    from tune_jobs.sweep.models import register_sweep_best  # Tune, as in run_compare
    from tune_jobs.sweep.options import SweepInterrupted

    base, methods, out = plan.base, plan.methods, plan.out
    out.mkdir(parents=True, exist_ok=True)
    client, parent_id = None, None
    if parent.uri is not None:
        client = parent.connect(base.tracking.experiment)
        parent_id = open_recorded(parent, out, state, plan.name, {"compare_parent": "true"}, plan.params)
    elif state is None:
        write_json(out / "state.json", {"parent_run_id": None, "params": plan.params})
    t0 = time.perf_counter()
    try:
        if side_by_side:
            from tune_jobs.compare_drivers import run_drivers  # the methods side by side, a driver process each

            run_drivers({m: partial(run_method, plan, m, parent_id, parent.uri) for m in todo}, plan.parallel)
        else:
            shared: dict[Any, Any] = {}  # the datasets' one object-store copy for every sweep (run_sweep's put_sources)
            for m in todo:
                run_method(plan, m, parent_id, parent.uri, shared)
    except SweepInterrupted as exc:  # a sweep's own hint (--resume --name) is not how a comparison continues
        raise SweepInterrupted(exc.reason, f"{exc.reason}: comparison stopped; its finished phases and Tune's "
                               "state are saved: rerun the same command to continue") from None
    phase1 = {m: json.loads(phase_file(out, "phase1", m).read_text()) for m in methods}
    phase2 = {m: {int(k): v for k, v in json.loads(phase_file(out, "phase2", m).read_text()).items()} for m in methods}
    report = write_report(out, list(methods), list(plan.seeds), phase1, phase2, plan.target, base)
    registered = None
    if client is not None:
        assert parent.uri is not None  # a client only where there is a store (above)
        client.log_text(parent_id, report["md"], "compare.md")
        client.log_text(parent_id, report["csv"], "compare.csv")
        for png in report["plots"]:
            client.log_artifact(parent_id, png, "plots")
        top = max(report["rows"], key=lambda r: r["test_acc_mean"])["method"]  # the report's first row
        register = plan.options.register
        registered = register_sweep_best(client, parent.uri, parent.experiment_id,
                                         plan.sweep_name(top, "seeds"), register) if register else None
    return {"table": report["md"], "out": str(out), "parent_run_id": parent_id, "tracking_uri": parent.uri,
            "wall_seconds": time.perf_counter() - t0, "results": report["rows"], "registered": registered}


def phase_file(out: Path, phase: str, method: str) -> Path:
    """``<out>/<phase>/<method>.json``: a method's finished phase (``phase1`` or ``phase2``), never redone."""
    return out / phase / f"{method}.json"


def run_method(plan: ComparePlan, method: str, parent_id: str | None, uri: str | None,
               shared: dict[Any, Any] | None = None) -> None:
    """Phase 1, then phase 2 of ``method``, each skipped when its :func:`phase_file` exists and written when it
    ends; the sweeps nest under ``parent_id`` in the store at ``uri`` (None: untracked). ``shared``: the datasets'
    object-store copy for every sweep of this process (``run_sweep``'s)."""
    from ray import tune  # Tune when a phase runs: `lcfed` imports this module to build its parser

    from tune_jobs.sweep.run import restore_results, run_sweep

    config = plan.configs[method].replace(**({"tracking.uri": uri, "tracking.enabled": True} if uri else {}))
    done = phase_file(plan.out, "phase1", method)
    if done.exists():
        phase1 = json.loads(done.read_text())
    else:
        print(f"lcfed compare: phase 1, {method}: {plan.budget} trials on {METRIC}", file=sys.stderr, flush=True)
        summary = run_sweep(config, plan.spaces[method], plan.tuning(method), parent_run_id=parent_id,
                            shared=shared, label=method)
        phase1 = {"best_config": summary["best_config"], METRIC: summary[f"best_{METRIC}"],
                  "trials": summary["trials"], "errors": summary["errors"], "run_id": summary["parent_run_id"]}
        write_json(done, phase1)
    done = phase_file(plan.out, "phase2", method)
    if done.exists():
        return
    print(f"lcfed compare: phase 2, {method}: seeds {list(plan.seeds)}", file=sys.stderr, flush=True)
    summary = run_sweep(config.replace(**phase1["best_config"]), {"seed": tune.grid_search(list(plan.seeds))},
                        plan.seeding(method), parent_run_id=parent_id, named=phase1["best_config"], shared=shared,
                        label=method)
    write_json(done, _seed_rows(restore_results(summary["storage"])))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare", help="tune methods on one budget (validation), re-run them on seeds, report mean ± CI and "
        "paired tests",
        description="Compare methods fairly: phase 1 tunes each method by a sweep of --budget trials on "
        "validation accuracy; phase 2 runs each chosen config on --seeds seeds; the report gives the test "
        "accuracy's mean ± 95 % CI and paired tests between methods (compare.md, compare.csv, compare.png).",
        epilog=examples(
            "lcfed compare --config configs/digits_dirichlet.yaml --methods lcfed,fedavg,standalone,ifca",
            "lcfed compare --methods lcfed,standalone --budget 4 --seeds 0,5,9 --out outputs/cmp"))
    config_options(p, "base config (data, budget, engine, tracking)", "override a base field")
    p.add_argument("--methods", required=True, help="comma-separated, e.g. lcfed,fedavg,standalone,ifca")
    p.add_argument("--budget", type=int, default=8, help="phase-1 trials per method (default %(default)s)")
    p.add_argument("--seeds", default="3", help="phase-2 seeds: a count or a list, e.g. 3 or 0,5,9 (default 3)")
    p.add_argument("--space-dir", help="per-method search spaces <dir>/<method>.yaml (default: the bundled ones, "
                   "tune_jobs/spaces/compare)")
    add_sweep_options(p, ("search", "scheduler", "max_concurrent", "gpus_per_trial"), help=COMPARE_HELP)
    p.add_argument("--target", type=float, help="test accuracy for bytes / simulated time to target "
                   "(default: 90 %% of the weakest method's)")
    p.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
                   help="methods run at once, each by its own driver process on the same Ray (default %(default)s; "
                   "1: one after the other in this process)")
    p.add_argument("--out", default="outputs/compare", help="output directory; rerun with the same one to resume")
    add_sweep_options(p, ("storage", "name", "keep_checkpoints", "register"), help=COMPARE_HELP,
                      defaults={"storage": None})
    add_no_track(p, "do not log to MLflow (as --set tracking.enabled=false): no parent or nested runs, no tracking "
                 "store created; the report still goes to --out")
    verbosity_options(p, "no progress tables: errors and the report only")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    base = tracking_of(load_config(args.config, args.set), args.no_track)
    check_output_dir(args.out, "--out")
    if base.tracking.enabled:  # tracked unless --no-track or tracking.enabled=false
        check_tracking_store(base.tracking.uri)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    result = run_compare(base, methods, args.out, sweep_options(args), budget=args.budget,
                         seeds=parse_seeds(args.seeds), space_dir=args.space_dir, target=args.target,
                         parallel=args.parallel)
    print(result["table"])
    run = f"; MLflow parent run {result['parent_run_id']}" if result["parent_run_id"] else ""
    print(f"lcfed compare: {result['out']}/compare.md, compare.csv, compare.png{run} ({result['wall_seconds']:.0f} s)")
    if result["registered"]:
        reg = result["registered"]
        print(f"lcfed compare: registered {reg['uri']} ({reg['model']} models of run {reg['run_id']})")
    return 0
