"""Ray layer: the Ray engine (ray_engine), its actors (hosts), the cluster's nodes (nodes) and the placement
arithmetic (placement). Holds no algorithm."""
