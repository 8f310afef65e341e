"""Outermost layer: the ``lcfed`` command (cli.py), Tune sweeps (sweep/), paper reproductions, method
comparisons, the MLflow server, Ray jobs and a local Ray head; one parent-run lifecycle (parent_run.py)."""
