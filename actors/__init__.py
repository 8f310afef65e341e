"""Ray layer: the Ray engine (ray_engine), its actors (hosts), the cluster's nodes (nodes) and the placement
arithmetic (placement), and what a cluster can ever hold (feasibility). Holds no algorithm."""
