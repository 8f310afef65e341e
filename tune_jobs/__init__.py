"""Outermost layer: the ``lcfed`` command (cli.py: parser, dispatch, the small commands; a module per
other command registers its own parser), Tune sweeps (sweep/), paper reproductions, method comparisons,
the MLflow server (mlflow_server.py, its process group in server_group.py), Ray jobs and a local Ray
head; one parent-run lifecycle (parent_run.py)."""
