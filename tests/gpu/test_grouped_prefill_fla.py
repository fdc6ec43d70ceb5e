"""A prefill step in several calls on the GPU (fla's chunked rule, a call at a time, with chunk
indices built on the host; request groups, and two lone requests as halves through the Triton
conv's row map) against the same step in one fla call, and the prefix cache's snapshots from inside
a step: tests/grouped_prefill.py on the tiny hybrid model in fp32; and those host-built chunk
indices against fla's own."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from minisgl import LLM
from grouped_prefill import SNAPSHOT_CUTS, STEPS, grouped_against_whole, snapshots_against_stops

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("decodes", [0, 3], ids=["prefill", "mixed"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_fla_prefill_in_calls_equals_one_call(tiny_checkpoints, step: str, decodes: int) -> None:
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cuda", page_size=16, max_running_requests=12,
              context_length=4096, piecewise_cuda_graph_max_tokens=0)
    assert type(llm.engine.model.layers[0].linear_attn.backend).__name__ == "FlaGDNBackend"
    for what, err in grouped_against_whole(llm.engine, step, decodes):
        assert err < 1e-5, f"{what}: relative error {err:.2e}"


# fla's fp32 dots round at TF32 precision (2^-11 relative, Triton's default), so inputs that differ
# at fp32 rounding give sums that differ at TF32 rounding. Cut anywhere, the stopped run feeds the
# group's prompts in other steps than the cut one; the projections' GEMMs then run at other token
# counts (cuBLAS picks kernels by them) and round otherwise at fp32 (6e-8 on the conv's inputs),
# which fla takes to 1.2e-5 on a snapshot and 4.7e-5 on the states after the step (H100, 2026-12-05,
# docs/benchmarks.md). Cut at chunk multiples, every error was 1e-7 or less.
SNAPSHOT_BOUNDS = {"aligned": 1e-5, "anywhere": 2e-4}


@pytest.mark.parametrize("cuts", sorted(SNAPSHOT_CUTS))
def test_fla_snapshots_are_the_states_where_a_prefill_would_stop(tiny_checkpoints, cuts: str) -> None:
    """The prefix cache's snapshots from inside a step through fla and the Triton conv (its row map
    under the halves' cuts) against a run that stops at every cut, which chunks every piece alike
    (tests/grouped_prefill.py; cut elsewhere, fla would round otherwise at TF32 precision). Every
    error is printed before any is asserted."""
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cuda", page_size=16, context_length=4096,
              piecewise_cuda_graph_max_tokens=0)
    assert type(llm.engine.model.layers[0].linear_attn.backend).__name__ == "FlaGDNBackend"
    errors = snapshots_against_stops(llm.engine, cuts)
    print(", ".join(f"{what} {err:.1e}" for what, err in errors))
    for what, err in errors:
        assert err < SNAPSHOT_BOUNDS[cuts], f"{what}: relative error {err:.2e}"


def test_host_chunk_indices_are_flas() -> None:
    """The fla backend builds fla's chunk indices on the host from the lengths (no device wait);
    they must be what fla builds from cu_seqlens."""
    from fla.ops.utils.index import prepare_chunk_indices  # fla: on the GPU only

    from minisgl.gdn.fla_backend import FLA_CHUNK, chunk_indices

    rng = random.Random(0)
    for _ in range(100):
        lens = [rng.choice([1, 5, 63, 64, 65, 129, 1000, 4096]) for _ in range(rng.randint(1, 20))]
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int64, device="cuda")
        want = prepare_chunk_indices(cu, FLA_CHUNK)
        assert torch.equal(torch.tensor(chunk_indices(lens), device="cuda").view(-1, 2), want), lens
