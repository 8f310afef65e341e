"""The best trial's models: logged on its MLflow child run from the final models its last checkpoint holds
(:data:`tune_jobs.sweep.trial.MODELS_FILE`), and registered in the Model Registry (``--register NAME``).

In the driver: trials never talk to MLflow, so the models travel in the trial's checkpoint (through the
sweep's storage, which every node reaches) and only the best trial's are logged: one set per sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lcfed.tracking import TrackingError, bundle_models, load_bundle, log_model, logging_models_to
from tune_jobs.sweep.trial import MODELS_FILE, trial_config

#: which logged model ``--register`` registers, the first the run has: the personalized models (what
#: ``acc_mean`` scores), else the global model, else the cluster models
REGISTERED = ("personal", "global", "clusters")


def model_uris(run: Any) -> dict[str, str]:
    """Name -> ``models:/`` URI of the models logged on ``run`` (its ``model.<name>`` tags)."""
    return {k[len("model."):]: v for k, v in run.data.tags.items() if k.startswith("model.")}


def log_best_models(client: Any, uri: str, best: Any, child: Any) -> dict[str, str]:
    """The best trial's final models logged on its child run ``child`` (once: a resumed sweep finds them);
    name -> URI, empty where its last checkpoint has none (it stopped before its last round)."""
    done = model_uris(child)
    if done or best.checkpoint is None:
        return done
    with best.checkpoint.as_directory() as d:
        path = Path(d) / MODELS_FILE
        if not path.is_file():
            return {}
        bundle = load_bundle(path)
    cfg = trial_config(best.config, str(best.metrics.get("trial_id")))
    step = int(best.metrics.get("round", 0))
    uris = {}
    with logging_models_to(uri):
        for name, module in bundle_models(cfg, bundle).items():
            uris[name] = log_model(child.info.run_id, name, module, step, cfg.method.name)
            client.set_tag(child.info.run_id, f"model.{name}", uris[name])
    return uris


def register_run(client: Any, uri: str, name: str, run: Any) -> dict[str, Any]:
    """A version of registered model ``name`` (created if new) from ``run``'s model (:data:`REGISTERED`),
    linked to the run and its logged model; a version already made from that model is reused (a rerun
    registers nothing new). What was registered: name, version, ``models:/<name>/<version>``, run."""
    from mlflow.exceptions import MlflowException  # the driver only

    uris = model_uris(run)
    which = next((m for m in REGISTERED if m in uris), None)
    if which is None:
        raise TrackingError(f"--register {name}: run {run.info.run_id} logged no model (its trial stopped before "
                           "its last round, or the store refused the models)")
    source, run_id = uris[which], run.info.run_id
    versions = [v for v in client.search_model_versions(f"name = '{name}'") if (v.source, v.run_id) == (source, run_id)]
    if not versions:
        try:  # MLflow's registry finds the logged model through the process-wide tracking URI
            with logging_models_to(uri):
                versions = [_new_version(client, name, source, run_id, which)]
        except MlflowException as exc:
            raise TrackingError(f"--register {name}: the store refused it: {exc.message}") from None
    version = int(versions[0].version)
    return {"name": name, "version": version, "model": which, "uri": f"models:/{name}/{version}", "run_id": run_id}


def _new_version(client: Any, name: str, source: str, run_id: str, which: str) -> Any:
    from mlflow.exceptions import MlflowException  # the driver only

    try:
        client.create_registered_model(name, description="the best trial of an lcfed sweep or comparison (--register)")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    return client.create_model_version(name, source, run_id=run_id, tags={"lcfed.model": which},
                                       model_id=source.removeprefix("models:/"))


def register_sweep_best(client: Any, uri: str, exp_id: str, sweep_name: str, name: str) -> dict[str, Any]:
    """:func:`register_run` of the best trial of sweep ``sweep_name`` (its parent run's ``best_run_id``)."""
    query = f"tags.sweep_name = '{sweep_name}' and tags.sweep_parent = 'true'"
    parents = client.search_runs([exp_id], query)
    best_id = parents[0].data.tags.get("best_run_id") if parents else None
    if best_id is None:
        raise TrackingError(f"--register {name}: sweep {sweep_name} has no best trial in the store")
    return register_run(client, uri, name, client.get_run(best_id))


def prune_models(results: Any, keep: Any | None) -> None:
    """Delete :data:`MODELS_FILE` from every trial's last checkpoint but ``keep``'s (the best trial, when its
    models are wanted): only one set of final models stays in the storage. Through the checkpoint's own
    filesystem, so a local path and ``s3://`` alike."""
    from pyarrow.fs import FileType  # Tune's filesystem layer (pyarrow comes with Ray Tune)

    kept = keep.metrics.get("trial_id") if keep is not None and keep.metrics else None
    for r in results:
        ck = r.checkpoint
        if ck is None or (kept is not None and r.metrics and r.metrics.get("trial_id") == kept):
            continue
        path = f"{ck.path.rstrip('/')}/{MODELS_FILE}"
        try:
            if ck.filesystem.get_file_info(path).type != FileType.NotFound:
                ck.filesystem.delete_file(path)
        except OSError:  # a storage that went read-only: the files stay, nothing else depends on them
            continue
