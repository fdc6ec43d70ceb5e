"""What one TP/EP rank holds, checked against slices of the whole model taken by hand: the
loader reads each rank's rows, columns, heads, experts and FP8 blocks (with their scales), and the
per-rank pool layout, whose bytes the memory planner counts, is what the pool allocates."""
from __future__ import annotations

import pytest
import torch

from minisgl.engine.plan import BackendNames
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig
from minisgl.layers.fp8 import FP8_DTYPE
from minisgl.models.config import QuantConfig, load_config, parse_config
from minisgl.models.known_configs import hf_config
from minisgl.models.materialize import build_module
from minisgl.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
from minisgl.models.sharding import pool_layout
from minisgl.models.weights import load_weights
from minisgl.parallel.config import ParallelConfig
from minisgl.parallel.shard import Shard
from minisgl.models.tiny.make import make_tiny_model

CPU = torch.device("cpu")
# An FP8 tiny model whose TP 2 shares are whole 128-blocks (heads and intermediates of 128 and 256).
FP8_SPLITTABLE = {"head_dim": 128, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                  "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256}


def _rank(tp: int, rank: int, ep: int = 1) -> ParallelConfig:
    return ParallelConfig(tp, rank, ep, tuple(range(tp)), group=object())  # no collective runs here


def _model(path: str, pc: ParallelConfig | None = None, fp8: QuantConfig | None = None) -> dict[str, torch.Tensor]:
    config = load_config(path)
    backends = BackendNames("torch", "torch", "torch").build()
    args = (config, backends, None) + ((pc,) if pc else ())
    model = build_module(lambda: Qwen3_5MoeForCausalLM(*args), torch.float32, CPU, fp8)
    load_weights(model, path, config)
    return dict(model.named_parameters())


def test_shard_reads_ranges_in_order() -> None:
    full = torch.arange(6 * 4).view(6, 4)
    s = Shard.along((6, 4), 0, (4, 6), (0, 1)).also(1, (1, 3))
    assert s.shape == (3, 2)
    assert torch.equal(s.read(full), torch.cat([full[4:6], full[0:1]])[:, 1:3])


def test_block_scales_need_block_boundaries() -> None:
    assert Shard.along((256, 130), 0, (128, 256)).block_scales((128, 128)) == Shard.along((2, 2), 0, (1, 2))
    assert Shard.along((300, 4), 0, (256, 300)).block_scales((128, 128)).cuts == ((0, ((2, 3),)),)  # edge block
    with pytest.raises(ValueError, match="cuts a 128-wide FP8 block"):
        Shard.along((256, 4), 0, (0, 64)).block_scales((128, 128))
    with pytest.raises(ValueError, match="cuts a 128-wide FP8 block"):
        Shard.along((300, 4), 0, (256, 300), (0, 128)).block_scales((128, 128))  # partial block mid-tensor


def test_rank_loads_its_heads_channels_experts_and_vocab(tiny_checkpoints) -> None:
    path = tiny_checkpoints["bf16"]  # fused experts on disk; 4 query heads, 2 KV heads, 2/4 GDN heads
    c = load_config(path)
    full = _model(path)
    d, i = c.head_dim, c.moe_intermediate_size
    kd, vd = c.linear_key_dim, c.linear_value_dim
    for rank in range(2):
        got = _model(path, _rank(2, rank, ep=2))
        half = lambda n: slice(rank * n // 2, (rank + 1) * n // 2)  # noqa: E731
        attn, gdn, moe = "layers.3.self_attn", "layers.0.linear_attn", "layers.3.mlp"
        expect = {
            "embed_tokens.weight": full["embed_tokens.weight"][half(c.vocab_size)],
            "lm_head.weight": full["lm_head.weight"][half(c.vocab_size)],
            f"{attn}.q_proj.weight": full[f"{attn}.q_proj.weight"][half(c.num_heads * 2 * d)],
            f"{attn}.k_proj.weight": full[f"{attn}.k_proj.weight"][half(2 * d)],
            f"{attn}.o_proj.weight": full[f"{attn}.o_proj.weight"][:, half(c.num_heads * d)],
            f"{gdn}.in_proj_qkv.weight": torch.cat([full[f"{gdn}.in_proj_qkv.weight"][off:][half(n)]
                                                    for off, n in ((0, kd), (kd, kd), (2 * kd, vd))]),
            f"{gdn}.conv1d.weight": torch.cat([full[f"{gdn}.conv1d.weight"][off:][half(n)]
                                               for off, n in ((0, kd), (kd, kd), (2 * kd, vd))]),
            f"{gdn}.A_log": full[f"{gdn}.A_log"][half(c.linear_num_value_heads)],
            f"{gdn}.out_proj.weight": full[f"{gdn}.out_proj.weight"][:, half(vd)],
            f"{gdn}.norm.weight": full[f"{gdn}.norm.weight"],
            f"{moe}.gate.weight": full[f"{moe}.gate.weight"],
            # EP 2: this rank's 4 experts, whole.
            f"{moe}.experts.gate_up_proj": full[f"{moe}.experts.gate_up_proj"][half(c.num_experts)],
            f"{moe}.shared_expert.down_proj.weight": full[f"{moe}.shared_expert.down_proj.weight"][:, half(i)],
        }
        for name, want in expect.items():
            assert torch.equal(got[name], want), (rank, name)
    # TP 2 without EP: every expert, half of each one's intermediate (gate rows, then up rows).
    got = _model(path, _rank(2, 1))
    gu = full[f"{moe}.experts.gate_up_proj"]
    assert torch.equal(got[f"{moe}.experts.gate_up_proj"], torch.cat([gu[:, i // 2 : i], gu[:, i + i // 2 :]], dim=1))
    assert torch.equal(got[f"{moe}.experts.down_proj"], full[f"{moe}.experts.down_proj"][:, :, i // 2 :])


def test_replicated_kv_head(tiny_checkpoints) -> None:
    path = tiny_checkpoints["qwen3_moe"]  # 2 KV heads: at TP 4 ranks 0, 1 read head 0 and ranks 2, 3 head 1
    c = load_config(path)
    full = _model(path)["layers.1.self_attn.v_proj.weight"]
    for rank in range(4):
        got = _model(path, _rank(4, rank))["layers.1.self_attn.v_proj.weight"]
        head = rank // 2
        assert torch.equal(got, full[head * c.head_dim : (head + 1) * c.head_dim]), rank


def test_fp8_rank_holds_its_blocks_and_scales(tmp_path) -> None:
    """Held as FP8 (the GPU layout, built on the CPU): each rank's codes and block scales are the
    whole model's rows of them; per-expert tensors on disk, each with its own scales."""
    path = make_tiny_model(str(tmp_path / "fp8"), fp8=True, seed=6, overrides=FP8_SPLITTABLE)
    c = load_config(path)
    full = _model(path, fp8=c.quant)
    i, b = c.moe_intermediate_size, 128
    for rank in range(2):
        got = _model(path, _rank(2, rank), fp8=c.quant)
        half = lambda n: slice(rank * n // 2, (rank + 1) * n // 2)  # noqa: E731
        q = "layers.3.self_attn.q_proj"
        assert got[f"{q}.weight"].dtype == FP8_DTYPE
        assert torch.equal(got[f"{q}.weight"].view(torch.uint8), full[f"{q}.weight"].view(torch.uint8)[half(c.num_heads * 256)])
        assert torch.equal(got[f"{q}.weight_scale_inv"], full[f"{q}.weight_scale_inv"][half(c.num_heads * 256 // b)])
        e = "layers.0.mlp.experts"
        gu, gus = full[f"{e}.gate_up_proj"].view(torch.uint8), full[f"{e}.gate_up_proj_scale_inv"]
        assert torch.equal(got[f"{e}.gate_up_proj"].view(torch.uint8),
                           torch.cat([gu[:, half(i)], gu[:, i:][:, half(i)]], dim=1))
        nb = i // b  # gate's block rows, then up's
        assert torch.equal(got[f"{e}.gate_up_proj_scale_inv"], torch.cat([gus[:, half(nb)], gus[:, nb:][:, half(nb)]], dim=1))
        assert torch.equal(got[f"{e}.down_proj_scale_inv"], full[f"{e}.down_proj_scale_inv"][:, :, half(nb)])


@pytest.mark.parametrize("tp", [2, 8])
def test_rank_pool_layout_is_what_the_pool_allocates(tp: int) -> None:
    """The planner prices slots and pages with the layout's bytes; the pool must allocate exactly
    those, at the 122B's shapes: 2 KV heads (replicated past TP 2), 16/64 GDN heads split."""
    config = parse_config(hf_config("Qwen3.5-122B-A10B"))
    layout = pool_layout(config, _rank(tp, tp - 1))
    assert layout.num_kv_heads == (1 if tp >= 2 else 2) and layout.num_value_heads == 64 // tp
    assert layout.conv_dim == config.conv_dim // tp
    cfg = PoolConfig(max_running_requests=4, max_seq_len=1024, page_size=64, num_pages=100)
    pool = HybridPool(layout, cfg, torch.bfloat16, "meta")
    assert pool.kv.nbytes == (cfg.usable_pages + 1) * layout.kv_bytes_per_page(64, torch.bfloat16)
    assert pool.state.bytes_per_slot == layout.state_bytes_per_slot(torch.bfloat16, torch.float32)
    single = pool_layout(config)
    assert layout.state_bytes_per_slot(torch.bfloat16, torch.float32) * tp == single.state_bytes_per_slot(
        torch.bfloat16, torch.float32)
