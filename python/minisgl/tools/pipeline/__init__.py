"""`python -m minisgl.tools.pipeline`: the AFD decode-step pipeline simulator
(docs/afd_layer_imbalance.md). cli.py is the command; sim.py the simulator; costs.py, table.py and
measured.py the three sources of per-layer costs; workload.py turns a workload into a step."""
