"""Benchmark clients: `python -m minisgl.bench serve` (an OpenAI-compatible server, the figures of
sglang.bench_serving) and `python -m minisgl.bench offline` (the LLM API's throughput)."""
