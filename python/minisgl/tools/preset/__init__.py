"""`python -m minisgl.tools.preset`: every value an AFD throughput preset derives (derive.py,
memory.py), printed as a dry run or as shell assignments (cli.py)."""
