"""GDN and paged-attention kernels against the device's copy bandwidth and fla, in one process.

    python benchmarks/bench_gdn_attention.py [--sweep] [--ns 1,8,...] [--ssm-dtype bfloat16] [--gdn-only]

Measures, in this order and in the same run: a large device-to-device copy (the bandwidth ceiling,
read + write counted); our in-place GDN decode vs fla's fused_recurrent_gated_delta_rule, plain
(contiguous states in, new states out) and the way an engine without a pooled kernel runs it
(pool[idx] gather, kernel, scatter back); the conv1d update; paged decode attention at 8K context;
and the prefill kernels (conv, fla's chunked delta rule). Shapes are Qwen3.5-122B's. Each time is the
median of triton.testing.do_bench, which flushes L2 between runs. --sweep first times the kernels'
tilings the kernels could use; the tables run their defaults. Prints tables; writes bench.json under $OUT when set.
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from minisgl.gdn.reference_math import gdn_gates
from minisgl.kernels.conv1d import conv1d_prefill, conv1d_update
from minisgl.kernels.gated_delta_decode import gated_delta_decode
from minisgl.kernels.paged_attention import default_num_splits, paged_decode

try:
    from fla.modules.causal_conv1d.ops import causal_conv1d, causal_conv1d_update
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
except ImportError:
    chunk_gated_delta_rule = None

DEV = "cuda"
H, HV, DK, DV = 16, 64, 128, 128  # 122B GDN heads
CONV_DIM, WIDTH = 2 * H * DK + HV * DV, 4
HQ, HKV, HEAD_DIM, PAGE, CONTEXT = 32, 2, 256, 64, 8192  # 122B full attention, 8K context


@dataclass
class Row:
    item: str
    n: int
    us: float
    tbps: float | None = None
    vs_copy: float | None = None
    vs_fla: float | None = None


def time_us(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def try_time_us(fn: Callable[[], object]) -> float:
    """For sweeps: a tiling that does not compile (out of shared memory, say) times as infinite."""
    try:
        return time_us(fn)
    except Exception as err:  # noqa: BLE001 - any compile or launch failure disqualifies the tiling
        print(f"    failed: {type(err).__name__}: {str(err).splitlines()[0][:100]}")
        return float("inf")


def copy_tbps() -> float:
    src = torch.randn(2**29, device=DEV)  # 2 GiB fp32
    dst = torch.empty_like(src)
    return 2 * src.nbytes / time_us(lambda: dst.copy_(src)) / 1e6


def row(item: str, n: int, us: float, nbytes: int | None, copy: float, ref_us: float | None = None) -> Row:
    tbps = nbytes / us / 1e6 if nbytes else None
    return Row(item, n, us, tbps, tbps / copy if tbps else None, ref_us / us if ref_us else None)


# ---------------------------------------------------------------- GDN decode
def gdn_inputs(n: int) -> dict[str, torch.Tensor]:
    qkv = torch.randn(n, CONV_DIM, dtype=torch.bfloat16, device=DEV)
    return dict(
        q=qkv[:, : H * DK].view(n, H, DK),
        k=qkv[:, H * DK : 2 * H * DK].view(n, H, DK),
        v=qkv[:, 2 * H * DK :].view(n, HV, DV),
        a=torch.randn(n, HV, dtype=torch.bfloat16, device=DEV),
        b=torch.randn(n, HV, dtype=torch.bfloat16, device=DEV),
        A_log=torch.linspace(0.01, 1.5, HV, device=DEV).log(),
        dt_bias=torch.randn(HV, device=DEV),
    )


def gdn_pool(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    pool = (torch.randn(n + 1, HV, DK, DV, device=DEV) * 0.1).to(dtype)
    return pool, torch.randperm(n, device=DEV) + 1


def sweep_gdn(ns: list[int], dtype: torch.dtype) -> None:
    print(f"\nGDN decode tilings (block_v, num_warps), {dtype} state: us at N =", ns)
    for block_v, warps in [(16, 2), (16, 4), (32, 2), (32, 4), (32, 8), (64, 4), (64, 8), (128, 4), (128, 8)]:
        times = []
        for n in ns:
            inp, (pool, slots) = gdn_inputs(n), gdn_pool(n, dtype)
            tiling = dict(block_v=block_v, num_warps=warps)
            times.append(try_time_us(lambda: gated_delta_decode(**inp, ssm_state=pool, slots=slots, **tiling)))
        print(f"  ({block_v:3d}, {warps}): " + "  ".join(f"{t:8.1f}" for t in times))


def gdn_decode_rows(ns: list[int], copy: float, dtype: torch.dtype) -> list[Row]:
    rows = []
    for n in ns:
        inp, (pool, slots) = gdn_inputs(n), gdn_pool(n, dtype)
        state_bytes = 2 * n * HV * DK * DV * dtype.itemsize  # read + write
        ours = time_us(lambda: gated_delta_decode(**inp, ssm_state=pool, slots=slots))
        fla = None
        if chunk_gated_delta_rule is not None:
            g, beta = gdn_gates(inp["a"], inp["b"], inp["A_log"], inp["dt_bias"])
            q, k, v = (inp[x].unsqueeze(1).contiguous() for x in "qkv")
            g, beta = g.unsqueeze(1), beta.unsqueeze(1)
            h0 = pool[slots]

            def fla_plain() -> object:
                return fused_recurrent_gated_delta_rule(
                    q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True
                )

            def fla_gather_scatter() -> None:
                _, ht = fused_recurrent_gated_delta_rule(
                    q, k, v, g, beta, initial_state=pool[slots], output_final_state=True, use_qk_l2norm_in_kernel=True
                )
                pool[slots] = ht.to(pool.dtype)  # fla returns fp32 final states

            fla = time_us(fla_plain)
            rows.append(row("gdn decode fla", n, fla, state_bytes, copy))
            rows.append(row("gdn decode fla+gather/scatter", n, time_us(fla_gather_scatter), state_bytes, copy))
        rows.append(row("gdn decode ours (in place)", n, ours, state_bytes, copy, fla))
    return rows


# ---------------------------------------------------------------- conv update
def conv_update_rows(ns: list[int], copy: float) -> list[Row]:
    rows = []
    weight = torch.randn(CONV_DIM, WIDTH, dtype=torch.bfloat16, device=DEV)
    for n in ns:
        x = torch.randn(n, CONV_DIM, dtype=torch.bfloat16, device=DEV)
        state = torch.randn(n + 1, CONV_DIM, WIDTH - 1, dtype=torch.bfloat16, device=DEV)
        slots = torch.randperm(n, device=DEV) + 1
        nbytes = n * CONV_DIM * 2 * (2 * (WIDTH - 1) + 2)  # state read + write, x in, out
        fla = None
        if chunk_gated_delta_rule is not None:
            cache = torch.randn(n, CONV_DIM, WIDTH, dtype=torch.bfloat16, device=DEV)
            fla = time_us(lambda: causal_conv1d_update(x, cache, weight=weight, activation="silu"))
            rows.append(row("conv update fla (own layout)", n, fla, nbytes, copy))
        ours = time_us(lambda: conv1d_update(x, weight, state, slots))
        rows.append(row("conv update ours", n, ours, nbytes, copy, fla))
    return rows


# ---------------------------------------------------------------- paged decode attention
def attention_setup(batch: int):
    width = CONTEXT // PAGE
    pages = batch * width + 1
    table = torch.zeros(batch + 1, width, dtype=torch.int32, device=DEV)
    table[:batch] = (torch.randperm(pages - 1, device=DEV) + 1).view(batch, width).int()
    k = torch.randn(pages * PAGE, HKV, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    v = torch.randn_like(k)
    q = torch.randn(batch, HQ, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    rows = torch.arange(batch, device=DEV)
    lens = torch.full((batch,), CONTEXT, dtype=torch.int32, device=DEV)
    return q, k, v, table, rows, lens


# (block_n, num_warps, num_stages); paged_decode halves block_n where the tiles would not fit.
ATTN_TILINGS = [(32, 4, 2), (32, 4, 3), (32, 4, 4), (32, 8, 3), (64, 4, 2), (64, 8, 2), (16, 4, 4), (16, 2, 4)]


def sweep_attention(batch: int) -> None:
    q, k, v, table, rows, lens = attention_setup(batch)
    base = default_num_splits(batch, HKV, q.device)
    print(f"\npaged decode tilings at B={batch}, {CONTEXT} ctx (block_n, warps, stages) x splits:")
    for block_n, warps, stages in ATTN_TILINGS:
        line = []
        for splits in (base, 2 * base):
            cfg = dict(num_splits=splits, block_n=block_n, num_warps=warps, num_stages=stages)
            us = try_time_us(lambda: paged_decode(q, k, v, table, rows, lens, PAGE, HEAD_DIM**-0.5, **cfg))
            line.append(f"{splits:2d} splits {us:7.1f}")
        print(f"  ({block_n:3d}, {warps}, {stages}): " + "   ".join(line))


def attention_rows(ns: list[int], copy: float) -> list[Row]:
    out = []
    for batch in ns:
        q, k, v, table, rows, lens = attention_setup(batch)
        nbytes = 2 * batch * CONTEXT * HKV * HEAD_DIM * 2  # K and V read once
        us = time_us(lambda: paged_decode(q, k, v, table, rows, lens, PAGE, HEAD_DIM**-0.5))
        out.append(row(f"paged decode attn {CONTEXT} ctx", batch, us, nbytes, copy))
    return out


# ---------------------------------------------------------------- prefill
CONV_TILINGS = [(32, 512, 4), (16, 512, 4), (32, 1024, 4), (32, 256, 2), (32, 512, 2), (32, 2048, 8), (64, 1024, 4)]


def sweep_conv_prefill(batch: int, length: int) -> None:
    print(f"\nconv prefill tilings at {batch}x{length} (block_t, block_c, num_warps): us")
    cu = F.pad(torch.full((batch,), length, device=DEV).cumsum(0), (1, 0)).to(torch.int32)
    x = torch.randn(batch * length, CONV_DIM, dtype=torch.bfloat16, device=DEV)
    weight = torch.randn(CONV_DIM, WIDTH, dtype=torch.bfloat16, device=DEV)
    state = torch.randn(batch + 1, CONV_DIM, WIDTH - 1, dtype=torch.bfloat16, device=DEV)
    slots = torch.arange(1, batch + 1, device=DEV)
    for block_t, block_c, warps in CONV_TILINGS:
        tiling = dict(block_t=block_t, block_c=block_c, num_warps=warps)
        us = try_time_us(lambda: conv1d_prefill(x, weight, cu, state, slots, **tiling))
        print(f"  ({block_t:3d}, {block_c:3d}, {warps}): {us:8.1f}")

def prefill_rows(copy: float) -> list[Row]:
    rows = []
    weight = torch.randn(CONV_DIM, WIDTH, dtype=torch.bfloat16, device=DEV)
    for batch, length in [(1, 8192), (8, 1024), (4, 8192)]:
        total = batch * length
        cu = F.pad(torch.full((batch,), length, device=DEV).cumsum(0), (1, 0)).to(torch.int32)
        x = torch.randn(total, CONV_DIM, dtype=torch.bfloat16, device=DEV)
        state = torch.randn(batch + 1, CONV_DIM, WIDTH - 1, dtype=torch.bfloat16, device=DEV)
        slots = torch.arange(1, batch + 1, device=DEV)
        nbytes = 2 * total * CONV_DIM * 2
        fla = None
        if chunk_gated_delta_rule is not None:
            h0 = torch.randn(batch, CONV_DIM, WIDTH, dtype=torch.bfloat16, device=DEV)
            fla = time_us(lambda: causal_conv1d(x[None], weight, initial_state=h0, output_final_state=True,
                                                activation="silu", cu_seqlens=cu.long()))
            rows.append(row("conv prefill fla", total, fla, nbytes, copy))
        ours = time_us(lambda: conv1d_prefill(x, weight, cu, state, slots))
        rows.append(row(f"conv prefill ours {batch}x{length}", total, ours, nbytes, copy, fla))
        if chunk_gated_delta_rule is not None:
            inp = gdn_inputs(total)
            g, beta = gdn_gates(inp["a"], inp["b"], inp["A_log"], inp["dt_bias"])
            q, k, v = (inp[name].contiguous()[None] for name in "qkv")
            h0 = torch.randn(batch, HV, DK, DV, device=DEV) * 0.1
            us = time_us(lambda: chunk_gated_delta_rule(
                q, k, v, g[None], beta[None], initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long(),
            ))
            rows.append(row(f"gdn prefill fla chunk {batch}x{length}", total, us, None, copy))
    return rows


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    print(f"  {'item':36s} {'N':>6s} {'us':>9s} {'TB/s':>6s} {'xcopy':>6s} {'xfla':>6s}")
    for r in rows:
        ratios = " ".join(f"{x:6.2f}" if x is not None else f"{'-':>6s}" for x in (r.tbps, r.vs_copy, r.vs_fla))
        print(f"  {r.item:36s} {r.n:6d} {r.us:9.1f} {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,8,32,64,128,256,512")
    parser.add_argument("--sweep", action="store_true", help="also time alternative tilings")
    parser.add_argument("--ssm-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the GDN state pool's dtype (the engine's --mamba-ssm-dtype)")
    parser.add_argument("--gdn-only", action="store_true", help="only the GDN decode (sweep and table)")
    args = parser.parse_args()
    ssm_dtype = getattr(torch, args.ssm_dtype)
    ns = [int(n) for n in args.ns.split(",")]
    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; fla {'yes' if chunk_gated_delta_rule else 'no'}")
    copy = copy_tbps()
    print(f"copy bandwidth (2 GiB d2d, read + write): {copy:.2f} TB/s")

    if args.sweep:
        sweep_gdn([64, 256], ssm_dtype)
        if not args.gdn_only:
            sweep_attention(64)
            sweep_conv_prefill(4, 8192)
    tables = {f"GDN decode (H=16, HV=64, K=V=128, {args.ssm_dtype} state; traffic = state read + write)":
              gdn_decode_rows(ns, copy, ssm_dtype)}
    if not args.gdn_only:
        tables |= {
            f"conv1d update (C={CONV_DIM}, W={WIDTH}, bf16)": conv_update_rows(ns, copy),
            f"paged decode attention (Hq={HQ}, Hkv={HKV}, D={HEAD_DIM}, page {PAGE}, bf16; traffic = KV read)":
                attention_rows(ns, copy),
            "prefill (N = tokens)": prefill_rows(copy),
        }
    for title, rows in tables.items():
        print_table(title, rows)
    if os.environ.get("OUT"):
        result = dict(device=device, torch=torch.__version__, copy_tbps=copy,
                      tables={t: [asdict(r) for r in rows] for t, rows in tables.items()})
        with open(os.path.join(os.environ["OUT"], "bench.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
