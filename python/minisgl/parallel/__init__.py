"""Tensor and expert parallelism: the per-rank parallel config, the collectives a sharded step
issues, and the description of which part of a checkpoint tensor a rank holds. Sits low (beside
layers/): it imports only torch."""
