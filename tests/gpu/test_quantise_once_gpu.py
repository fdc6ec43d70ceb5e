"""One quantisation shared by the FP8 layers that read one input (kernels/activations.py) gives, bit
for bit, what each layer's own quantisation gave before: the linears of one input (a mixer's
projections) on each GEMM backend, the MoE block (shared expert and routed experts), and the routed
gate_up on each kernel path. Bitwise, so no tolerance: the same codes must reach the same kernels.

The shared codes are padded to cuBLAS's ROWS_MULTIPLE rows whichever GEMM reads them; before, the
Triton GEMMs' were not. So the references quantise unpadded (the linears' as fp8_linear did, the
MoE block's with ROWS_MULTIPLE patched to 1), at token counts that are not multiples of 4, where
the padding changes the scales' stride.

On the CPU through Triton's interpreter as well (its FP8 casts round wrongly, but alike on both sides).
"""
from __future__ import annotations

import pytest
import torch

from fp8_refs import random_fp8_moe_block
from kernel_checks import DEVICE

pytest.importorskip("triton")

from minisgl.kernels import fp8_gemm_cublas, fp8_quant  # noqa: E402
from minisgl.kernels.fp8_gemm import gemm_split_k  # noqa: E402
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE, cublas_block_scaling, cublas_fits, gemm_cublas  # noqa: E402
from minisgl.kernels.fp8_gemm_tiled import TileConfig, gemm_tiled  # noqa: E402
from minisgl.kernels.fp8_linear import REGIMES, fp8_linear  # noqa: E402
from minisgl.kernels.moe_align import align_experts  # noqa: E402
from minisgl.kernels.moe_gemm import moe_gate_up  # noqa: E402
from minisgl.kernels.activations import Activations  # noqa: E402
from minisgl.layers.fp8 import FP8_DTYPE, quantize_block_fp8  # noqa: E402
from minisgl.moe.local_moe import LocalMoE  # noqa: E402

pytestmark = pytest.mark.gpu

H, E, TOP_K, I = 256, 4, 2, 192  # I = 192: a partial 128-group in h
BACKENDS = ["split_k", "tiled"] + (["cublas"] if cublas_block_scaling(torch.device(DEVICE)) is None else [])


def _unpadded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantise as each Triton GEMM did for itself: no padding."""
    monkeypatch.setattr(fp8_gemm_cublas, "ROWS_MULTIPLE", 1)


def _x(t: int) -> torch.Tensor:
    x = torch.randn(t, H, device=DEVICE) * torch.rand(t, 1, device=DEVICE).add(0.1)
    return x.to(torch.bfloat16)


def _own_quantisation(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, backend: str, tile: TileConfig) -> torch.Tensor:
    """fp8_linear before sharing: the layer quantises x itself, padded for cuBLAS only (which takes
    only the weights it fits; the others fall back to the tile, as fp8_linear does)."""
    if backend == "cublas" and cublas_fits(w, s):
        return gemm_cublas(*fp8_quant.quantize_activations(x, ROWS_MULTIPLE), w, s, x.dtype)[: x.shape[0]]
    xq, xs = fp8_quant.quantize_activations(x)
    return gemm_split_k(xq, xs, w, s, x.dtype) if backend == "split_k" else gemm_tiled(xq, xs, w, s, x.dtype, tile)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [5, 37])
def test_linears_of_one_input_match_their_own_quantisation(backend: str, t: int, quantiser_calls: list[int]) -> None:
    torch.manual_seed(t)
    x = _x(t)
    weights = [quantize_block_fp8(torch.randn(n, H, device=DEVICE) / H**0.5) for n in (384, 128, 128)]  # q, k, v
    tile = REGIMES[-1].tile
    shared = Activations(x)
    got = [fp8_linear(shared, w, s, backend=backend, tile=tile) for w, s in weights]
    assert quantiser_calls == [t]
    assert shared.fp8()[0].shape[0] == -(-t // ROWS_MULTIPLE) * ROWS_MULTIPLE
    for out, (w, s) in zip(got, weights):
        assert torch.equal(out, _own_quantisation(x, w, s, backend, tile))


def _moe_block() -> LocalMoE:
    return random_fp8_moe_block(H, E, TOP_K, I, I)


def test_moe_block_matches_its_layers_own_quantisation(
    quantiser_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(1)
    block = _moe_block()
    assert block.experts.scales() and block.shared_expert.gate_proj.weight.dtype == FP8_DTYPE
    x = _x(37)
    with torch.inference_mode():
        got = block(x)
        assert len(quantiser_calls) == 3  # x once, the shared down projection's input, the routed h
        _unpadded(monkeypatch)
        # Before: each layer quantised x itself (the shared gate and up, the routed gate_up).
        weights, ids = block.route(x)
        se = block.shared_expert
        shared = torch.nn.functional.silu(se.gate_proj(x)) * se.up_proj(x)
        shared = torch.sigmoid(block.shared_expert_gate(x)) * se.down_proj(shared)
        routed = block.backend.forward(x, block.experts.gate_up_proj, block.experts.down_proj, ids, weights,
                                       **block.experts.scales())
    assert len(quantiser_calls) == 3 + 5
    assert torch.equal(got, routed + shared)


# (rows per block, gate_up tile): decode's kernel, prefill's large-M one with h in bf16 and with h
# quantised in its epilogue (block_n 128).
PATHS = [(16, {}), (32, dict(large_m=True, block_n=64, num_warps=4)), (64, dict(large_m=True, block_n=128, num_warps=4))]


@pytest.mark.parametrize("block_m,tile", PATHS)
def test_routed_gate_up_reads_shared_codes_as_its_own(block_m: int, tile: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(block_m)
    block = _moe_block()
    gate_up, gs = block.experts.gate_up_proj, block.experts.gate_up_proj_scale_inv
    x = _x(37)
    ids = torch.rand(x.shape[0], E, device=DEVICE).topk(TOP_K, dim=-1).indices
    g = align_experts(ids, E, block_m)
    got = moe_gate_up(Activations(x), gate_up, gs, g, **tile)
    _unpadded(monkeypatch)
    ref = moe_gate_up(x, gate_up, gs, g, **tile)
    assert isinstance(got, tuple) == isinstance(ref, tuple) == (tile.get("block_n") == 128)
    # Only the real rows are written (the rest of h is never read).
    pos = torch.cat([torch.arange(b * block_m, b * block_m + n, device=DEVICE)
                     for b, (owner, n) in enumerate(zip(g.block_expert.tolist(), g.block_rows.tolist())) if owner >= 0])
    for a, b in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)):
        assert torch.equal(a[pos], b[pos])
