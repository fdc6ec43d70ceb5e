"""A prefill step above GROUP_TOKENS on the GPU (fla's chunked rule, a group of requests at a time)
against the same step in one fla call: tests/grouped_prefill.py on the tiny hybrid model in fp32."""
from __future__ import annotations

import pytest

from minisgl import LLM
from grouped_prefill import grouped_against_whole

pytestmark = pytest.mark.gpu


def test_grouped_fla_prefill_equals_one_call(tiny_checkpoints) -> None:
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cuda", page_size=16, max_running_requests=8,
              context_length=4096, piecewise_cuda_graph_max_tokens=0)
    assert type(llm.engine.model.layers[0].linear_attn.backend).__name__ == "FlaGDNBackend"
    for what, err in grouped_against_whole(llm.engine):
        assert err < 1e-5, f"{what}: relative error {err:.2e}"
