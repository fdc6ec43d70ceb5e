"""How a model's heads, channels, experts and vocabulary split over tensor- and expert-parallel
ranks, the check that a model can be split so, run before anything is loaded or started, and
what one rank's pool then holds (pool_layout).

- Full attention: query heads split evenly; KV heads too, or, when there are fewer KV heads than
  ranks, each KV head is replicated on the tp / kv ranks whose query heads read it.
- GDN: key heads and value heads split evenly (a rank's value heads belong to its key heads), and
  with them the conv channels and the recurrent state.
- MoE: experts over the EP groups, each expert's intermediate dim over the ranks of its group;
  the shared expert over all ranks. Embedding and lm_head: the vocabulary over all ranks.
"""
from __future__ import annotations

from minisgl.kvcache.hybrid_pool import PoolLayout
from minisgl.models.config import ModelConfig
from minisgl.parallel.config import SINGLE, ParallelConfig, check_sizes


def _divides(what: str, total: int, parts: int, flag: str) -> str | None:
    if total % parts:
        return f"{flag} {parts} does not divide the model's {total} {what}"
    return None


def check_parallel(config: ModelConfig, tp_size: int, ep_size: int, flag: str = "--tp-size") -> None:
    """ValueError naming the first thing that cannot be split over `tp_size` ranks (`ep_size` expert
    groups); nothing else has happened yet when this runs."""
    check_sizes(tp_size, ep_size)
    if tp_size == 1 and ep_size == 1:
        return
    moe_tp = tp_size // ep_size
    nkv = config.num_kv_heads
    problems = [
        _divides("attention heads", config.num_heads, tp_size, flag),
        _divides("vocabulary entries (vocab_size)", config.vocab_size, tp_size, flag),
        _divides("routed experts", config.num_experts, ep_size, "--ep-size"),
        _divides("expert intermediate size (moe_intermediate_size)", config.moe_intermediate_size, moe_tp,
                 f"{flag} / --ep-size ="),
    ]
    if nkv >= tp_size and nkv % tp_size:
        problems.append(f"{flag} {tp_size} does not divide the model's {nkv} KV heads")
    if nkv < tp_size and tp_size % nkv:
        problems.append(f"the model's {nkv} KV heads cannot be replicated evenly over {flag} {tp_size} "
                        f"ranks ({tp_size} is not a multiple of {nkv})")
    if config.shared_expert_intermediate_size:
        problems.append(_divides("shared-expert intermediate size", config.shared_expert_intermediate_size,
                                 tp_size, flag))
    if config.linear_layers:
        problems.append(_divides("GDN key heads (linear_num_key_heads)", config.linear_num_key_heads, tp_size, flag))
        problems.append(_divides("GDN value heads (linear_num_value_heads)", config.linear_num_value_heads,
                                 tp_size, flag))
    problems += _fp8_cuts(config, tp_size, moe_tp, flag)
    first = next((p for p in problems if p), None)
    if first:
        raise ValueError(first)


def _fp8_cuts(config: ModelConfig, tp: int, moe_tp: int, flag: str) -> list[str]:
    """Each rank's share of an FP8 weight must be whole blocks: a block's one scale cannot be split."""
    if config.quant is None:
        return []
    b_rows, b_cols = config.quant.block
    d, gate = config.head_dim, 2 if config.attn_output_gate else 1
    heads, kv = config.num_heads * d, config.num_kv_heads * d
    # (what, full size, ranks it is split over, block); a replicated KV head is one head per rank.
    cuts = [
        ("q_proj rows", heads * gate, tp, b_rows),
        ("k_proj/v_proj rows", kv, min(tp, config.num_kv_heads), b_rows),
        ("o_proj columns", heads, tp, b_cols),
        ("expert gate/up rows", config.moe_intermediate_size, moe_tp, b_rows),
        ("expert down_proj columns", config.moe_intermediate_size, moe_tp, b_cols),
    ]
    if config.shared_expert_intermediate_size:
        s = config.shared_expert_intermediate_size
        cuts += [("shared-expert gate/up rows", s, tp, b_rows), ("shared-expert down_proj columns", s, tp, b_cols)]
    if config.linear_layers:
        cuts += [
            ("GDN in_proj_qkv q/k rows", config.linear_key_dim, tp, b_rows),
            ("GDN in_proj_qkv v rows and in_proj_z rows", config.linear_value_dim, tp, b_rows),
            ("GDN out_proj columns", config.linear_value_dim, tp, b_cols),
        ]
    return [
        f"{flag} {tp} would cut the FP8 checkpoint's {block}-wide weight blocks: {what} give each rank "
        f"{full // parts} of {full}, not a multiple of {block} (a block has one scale, so each rank's share "
        f"must be whole blocks)"
        for what, full, parts, block in cuts
        if parts > 1 and (full // parts) % block
    ]


def pool_layout(config: ModelConfig, parallel: ParallelConfig = SINGLE) -> PoolLayout:
    """What one rank's pool stores: its KV heads (one replicated head when there are fewer KV heads
    than ranks), and its GDN key/value heads' conv channels and recurrent state."""
    k0, k1 = parallel.kv_head_range(config.num_kv_heads)
    tp = parallel.tp_size
    linear = bool(config.linear_layers)
    return PoolLayout(
        full_layers=config.full_layers,
        num_kv_heads=k1 - k0,
        head_dim=config.head_dim,
        linear_layers=config.linear_layers,
        conv_dim=config.conv_dim // tp if linear else 0,
        conv_kernel=config.linear_conv_kernel_dim,
        num_value_heads=config.linear_num_value_heads // tp if linear else 0,
        key_head_dim=config.linear_key_head_dim,
        value_head_dim=config.linear_value_head_dim,
    )
