"""Triton kernels. Each module holds one kernel family and its launch wrapper; nothing here imports
from the rest of minisgl, so the backends above can be swapped without touching the kernels.

Shared padding convention: a batch row whose state slot is 0 (the dummy slot that CUDA-graph buckets
pad with) reads and writes no state and gets an all-zero output, so padding costs no state traffic
and slot 0 is never written.
"""
