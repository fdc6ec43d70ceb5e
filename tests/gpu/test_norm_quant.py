"""RMS norms that write their output's FP8 codes in their own pass (kernels/rms_norm.py, quantise=True).
The codes and scales must be quantize_activations' of the y returned with them, bit for bit (padded
for cuBLAS as Activations.fp8 pads them): the pass quantises the stored y by the quantiser's own rule.
y itself must be the norm without codes to an ulp a bf16 rounding of its chain (1e-5 relative in
fp32): with codes to store, Triton may lay the tile out otherwise (an earlier version
did, for 16-byte FP8 stores), which can change the order of a row's sum of squares (seen on an
H100), so y may move where a rounding flips. Then an FP8 model at the 122B's widths: the norms
before FP8 projections and the attention's output gate carry codes, the quantiser runs that many
times fewer a step, and the logits are those of the same kernels with their codes dropped."""
from __future__ import annotations

import json

import pytest
import torch

from kernel_checks import DEVICE

pytest.importorskip("triton")

from minisgl.kernels.activations import Activations  # noqa: E402
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE  # noqa: E402
from minisgl.kernels.fp8_quant import quantize_activations  # noqa: E402
from minisgl.kernels.rms_norm import add_rms_norm, gated_rms_norm, gated_rms_norm_runs, rms_norm  # noqa: E402

pytestmark = pytest.mark.gpu

EPS = 1e-6
FP32_REL = 1e-5  # a row's sum of squares in another order: a few fp32 ulps of y (test_fused_small_ops.py)
# bf16 ulps: one per rounding in the chain after the sum (test_fused_small_ops.py's ULPS, for the same reason).
ULPS = {"zero_centered": 1, "plain": 2, "gated": 3}


def _rows(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Per-token magnitudes over four decades, and (from 3 tokens) a token of zeros: scale 1."""
    x = torch.randn(*shape, device=DEVICE) * torch.rand(shape[0], *[1] * (len(shape) - 1), device=DEVICE).mul(4).add(0.01)
    if shape[0] > 2:
        x[1] = 0.0
    return x.to(dtype)


def _assert_codes_match(acts: Activations, y: torch.Tensor, ulps: int) -> None:
    """acts holds y [T, ...] (the norm without codes) as [T, features] to `ulps` bf16 ulps, and the
    quantiser's codes of its own y, bit for bit."""
    t = y.shape[0]
    flat = y.reshape(t, -1)
    q, s = acts.fp8()
    assert acts.x.shape == flat.shape and acts.x.dtype == flat.dtype
    if flat.dtype == torch.float32:  # no rounding to hide a reordered sum: a few fp32 ulps (as FP32_REL)
        allowed = FP32_REL * flat.abs()
    else:
        allowed = ulps * torch.ldexp(torch.full_like(flat, torch.finfo(flat.dtype).eps, dtype=torch.float32),
                                     torch.frexp(flat.float())[1] - 1)
    assert ((acts.x.float() - flat.float()).abs() <= allowed).all(), "y is further from the codeless norm's than a reordered sum moves it"
    ref_q, ref_s = quantize_activations(acts.x, ROWS_MULTIPLE)
    assert q.shape == ref_q.shape and s.shape == ref_s.shape and s.stride() == ref_s.stride()
    assert torch.equal(q[:t].view(torch.uint8), ref_q[:t].view(torch.uint8))
    assert torch.equal(s[:t], ref_s[:t])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("t", [1, 5, 37, 600])
@pytest.mark.parametrize("width", [3072, 256])  # 3072: the 122B's hidden, a tile of 4096 with masked groups
def test_rms_norm_codes(t: int, width: int, zero_centered: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(t + width)
    x = _rows((t, width), dtype)
    w = (torch.randn(width, device=DEVICE) * 0.2 + (0.0 if zero_centered else 1.0)).to(dtype)
    acts = rms_norm(x, w, EPS, zero_centered, quantise=True)
    _assert_codes_match(acts, rms_norm(x, w, EPS, zero_centered), ULPS["zero_centered" if zero_centered else "plain"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
# 16384: a 2 x 8K step's rows, where a tile kept in two layouts (one for the FP8 stores) quantised a y
# that differed from the stored one (an earlier version of the kernel; bench_norm_codes.py's check found it).
@pytest.mark.parametrize("t", [3, 600, 16384])
def test_add_rms_norm_codes(t: int, dtype: torch.dtype) -> None:
    torch.manual_seed(t)
    x, delta = _rows((t, 3072), dtype), _rows((t, 3072), dtype)
    w = (torch.randn(3072, device=DEVICE) * 0.2).to(dtype)
    h, acts = add_rms_norm(x, delta, w, EPS, True, quantise=True)
    ref_h, ref_y = add_rms_norm(x, delta, w, EPS, True)
    assert torch.equal(h, ref_h)
    _assert_codes_match(acts, ref_y, ULPS["zero_centered"])


# [T, heads, C]: the 122B's GDN output (64 heads of 128), and two groups a row (256).
@pytest.mark.parametrize("heads,cols", [(64, 128), (3, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [1, 7, 600])
def test_gated_rms_norm_codes(t: int, heads: int, cols: int, dtype: torch.dtype) -> None:
    torch.manual_seed(t * heads + cols)
    x, z = _rows((t, heads, cols), dtype), _rows((t, heads, cols), dtype) * 3
    w = (torch.randn(cols, device=DEVICE) * 0.2 + 1.0).to(dtype)
    acts = gated_rms_norm(x, z, w, EPS, quantise=True)
    _assert_codes_match(acts, gated_rms_norm(x, z, w, EPS), ULPS["gated"])


@pytest.mark.parametrize("quantise", [True, False])
def test_gated_norm_over_runs_equals_one_launch(quantise: bool) -> None:
    """x given as runs of its rows in other buffers (a GDN step's calls, layers/row_pieces.py), listed
    out of order: y and its codes bit for bit one launch's over the assembled x."""
    torch.manual_seed(5)
    t, heads, cols = 700, 64, 128
    x, z = _rows((t, heads, cols), torch.bfloat16), _rows((t, heads, cols), torch.bfloat16)
    w = (torch.randn(cols, device=DEVICE) * 0.2 + 1.0).to(torch.bfloat16)
    cuts = [(300, 700), (0, 37), (37, 300)]
    runs = [(x[a:b].clone(), a) for a, b in cuts]  # each run in a buffer of its own
    got = gated_rms_norm_runs(runs, z, w, EPS, quantise=quantise)
    ref = gated_rms_norm(x, z, w, EPS, quantise=quantise)
    if not quantise:
        assert torch.equal(got, ref)
        return
    assert torch.equal(got.x, ref.x)
    (q, s), (ref_q, ref_s) = got.fp8(), ref.fp8()
    assert torch.equal(q[:t].view(torch.uint8), ref_q[:t].view(torch.uint8)) and torch.equal(s[:t], ref_s[:t])


def test_runs_that_do_not_fit_are_refused() -> None:
    z = torch.randn(10, 2, 128, device=DEVICE)
    w = torch.ones(128, device=DEVICE)
    with pytest.raises(ValueError, match="does not fit"):
        gated_rms_norm_runs([(torch.randn(4, 2, 128, device=DEVICE), 0), (torch.randn(8, 2, 128, device=DEVICE), 4)], z, w, EPS)


def test_no_rows() -> None:
    x = torch.empty(0, 256, device=DEVICE, dtype=torch.bfloat16)
    acts = rms_norm(x, torch.ones(256, device=DEVICE, dtype=torch.bfloat16), EPS, True, quantise=True)
    assert acts.x.shape == (0, 256) and acts.fp8()[0].shape == (0, 256)


@pytest.mark.parametrize("shape", [(4, 200), (4, 4, 32), (4, 96)])  # rows not of whole 128-groups
def test_rows_without_whole_groups_are_refused(shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, device=DEVICE)
    with pytest.raises(ValueError, match="128-groups"):
        rms_norm(x, torch.ones(shape[-1], device=DEVICE), EPS, True, quantise=True)


def test_fp8_model_norms_carry_codes(tmp_path, monkeypatch: pytest.MonkeyPatch, quantiser_calls: list[int]) -> None:
    """4 layers at the 122B's widths (3 GDN, 1 attention), FP8, eager: every input and post-mixer
    norm, every GDN output norm and the attention's output gate writes codes, which saves 2
    quantiser passes a layer and 1 a mixer; with the same kernels' codes dropped (their readers
    quantise the same y themselves) the logits are bit for bit the same. Against norms without codes the logits could move: y may differ
    by an ulp (above), and on random weights a router near a tie picks another expert for it."""
    from minisgl.engine.args import EngineArgs
    from minisgl.engine.engine import Engine
    from minisgl.engine.plan import resolve_plan
    from minisgl.kernels import rms_norm as norm_kernels
    from minisgl.kernels import sigmoid_gate as gate_kernel
    from minisgl.models.known_configs import hf_config

    raw = hf_config("Qwen3.5-122B-A10B", fp8=True)
    raw["text_config"]["num_hidden_layers"] = 4
    (tmp_path / "config.json").write_text(json.dumps(raw))
    engine = Engine(resolve_plan(EngineArgs(str(tmp_path), load_format="dummy", page_size=64, max_running_requests=4,
                                            context_length=1024, piecewise_cuda_graph_max_tokens=0)))
    layers = engine.model.layers
    norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    norms += [layer.linear_attn.norm for layer in layers if not layer.is_full]
    assert len(norms) == 11 and all(n.fp8_output for n in norms)
    gates = [layer.self_attn for layer in layers if layer.is_full]
    assert len(gates) == 1 and all(a.gate_codes for a in gates)
    calls = quantiser_calls
    prompts = [torch.randint(0, 248320, (300 + 40 * i,)).tolist() for i in range(2)]

    def prefill() -> torch.Tensor:
        slots = [engine.pool.allocate(400) for _ in prompts]
        for s in slots:
            engine.pool.ensure_tokens(s, 400)
        logits = engine.forward_batch(engine.make_batch(prompts, [0] * len(prompts), slots))
        for s in slots:
            engine.pool.free(s)
        return logits

    before = len(calls)  # the engine's warm-up quantised too
    fused = prefill()
    fused_calls = len(calls) - before

    def dropping_codes(kernel):  # the norm as it is, its codes dropped: the readers quantise its y
        def call(*args, **kwargs):
            out = kernel(*args, **kwargs)
            h, y = out if isinstance(out, tuple) else (None, out)
            y = Activations(y.x) if isinstance(y, Activations) else y
            return y if h is None else (h, y)
        return call

    for name in ("rms_norm", "add_rms_norm", "gated_rms_norm_runs"):
        monkeypatch.setattr(norm_kernels, name, dropping_codes(getattr(norm_kernels, name)))
    monkeypatch.setattr(gate_kernel, "sigmoid_gate", dropping_codes(gate_kernel.sigmoid_gate))
    dropped = prefill()
    assert len(calls) - before - 2 * fused_calls == len(norms) + len(gates)
    assert torch.equal(fused, dropped), "the kernels' codes are not those their readers would make of y"
