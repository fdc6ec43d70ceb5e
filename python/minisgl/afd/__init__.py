"""Attention-FFN disaggregation: attention workers own requests, pools, attention, router and
sampling; expert workers own the routed experts; a coordinator plans every step."""
