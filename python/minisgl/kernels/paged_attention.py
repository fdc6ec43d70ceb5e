"""Causal GQA attention over a paged KV cache: a split-KV decode kernel and a varlen extend kernel.

Cache layout: k_cache, v_cache [num_pages * page_size, Hkv, D]; position p of the request whose
page-table row is r lives at table[r, p // page_size] * page_size + p % page_size. New tokens'
K/V must already be in the cache: both kernels read every key, cached or new, from it.

A program serves one KV head and all GROUP = Hq / Hkv query heads that share it, so each K/V tile
is loaded once per program and feeds a [rows, BLOCK_N] tensor-core product. Softmax runs in base 2
with the scale folded into log2(e). On Hopper the extend kernel reads whole-page K/V tiles through
TMA descriptors (its masked tiles, at most a block's own span, keep pointer loads, which zero the
keys past a request's length). A cache in another dtype than q (FP8 codes with a scale of 1,
--kv-cache-dtype fp8_e4m3) is converted to q's dtype as its tiles load: half the bytes read.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _kv_tile(cache, table_ptr, row, pos, pmask, PAGE_SIZE: tl.constexpr, kv_head, stride_t, stride_h, od, dmask):
    """[BLOCK_N, BLOCK_D] keys or values at positions `pos` of the request on table row `row`."""
    page = tl.load(table_ptr + row + pos // PAGE_SIZE, mask=pmask, other=0).to(tl.int64)
    loc = page * PAGE_SIZE + pos % PAGE_SIZE
    ptr = cache + loc[:, None] * stride_t + kv_head * stride_h + od[None, :]
    return tl.load(ptr, mask=pmask[:, None] & dmask[None, :], other=0.0)


@triton.jit
def _online_softmax(s, v, m, l, acc, PRECISION: tl.constexpr):
    """One online-softmax step in base 2: fold a KV tile's scores s [rows, BLOCK_N] (masked ones -inf)
    and values v [BLOCK_N, BLOCK_D] into each row's running max m, sum l and output acc. The max is
    floored at -1e30, so a row that has seen no key yet never computes -inf - (-inf); its l stays 0."""
    m_new = tl.maximum(tl.maximum(m, tl.max(s, axis=1)), -1e30)
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def _unmasked_softmax_step(s, v, m, l, acc, qk_scale, PRECISION: tl.constexpr):
    """_online_softmax for a tile no row masks: s are raw scores and the scale is applied inside the
    exponent (one FMA an element), and PV accumulates into acc in place. (Rescaling acc only when a
    row's max grew by more than 2^8 was measured 5-11% slower on the H200: the branch in the loop
    costs the pipelining more than the skipped multiply saves.)"""
    m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def _page_tile(cache, desc, table_ptr, row, start, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, kv_head,
               stride_t, stride_h, od, dmask, D: tl.constexpr, EVEN_D: tl.constexpr, TMA: tl.constexpr):
    """[BLOCK_N, BLOCK_D] keys or values at positions start .. start + BLOCK_N, all of them below the
    request's length, so nothing is masked but the head dimension's padding. When the tile lies in
    one page (PAGE_SIZE a multiple of BLOCK_N, start a multiple of BLOCK_N) one table entry gives
    its rows, which are then contiguous: with TMA, one copy from `desc`, a descriptor over the cache
    as [positions, Hkv * D] in [BLOCK_N, D] boxes."""
    n = tl.arange(0, BLOCK_N)
    if TMA:
        page = tl.load(table_ptr + row + start // PAGE_SIZE)
        return desc.load([page * PAGE_SIZE + start % PAGE_SIZE, kv_head * D])
    if PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(table_ptr + row + start // PAGE_SIZE).to(tl.int64)
        loc = page * PAGE_SIZE + start % PAGE_SIZE + n
    else:
        pos = start + n
        loc = tl.load(table_ptr + row + pos // PAGE_SIZE).to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    ptr = cache + loc[:, None] * stride_t + kv_head * stride_h + od[None, :]
    if EVEN_D:
        return tl.load(ptr)
    return tl.load(ptr, mask=dmask[None, :], other=0.0)


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache, v_cache, table_ptr, rows_ptr, seqlen_ptr, part_out, part_lse,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_table, qk_scale,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    kv_head = tl.program_id(1)
    req = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seqlen_ptr + req)
    row = tl.load(rows_ptr + req).to(tl.int64) * stride_table
    # Splits are sized on the device from this request's length, so one launch shape (and one
    # captured graph) serves every length; trailing splits of short requests are empty.
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    oh = tl.arange(0, BLOCK_H)
    od = tl.arange(0, BLOCK_D)
    hmask = oh < GROUP
    dmask = od < D
    heads = kv_head * GROUP + oh
    q = tl.load(q_ptr + req * stride_qt + heads[:, None] * stride_qh + od[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pmask = pos < hi
        k = _kv_tile(k_cache, table_ptr, row, pos, pmask, PAGE_SIZE, kv_head, stride_kt, stride_kh, od, dmask)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * qk_scale
        s = tl.where(pmask[None, :], s, float("-inf"))
        v = _kv_tile(v_cache, table_ptr, row, pos, pmask, PAGE_SIZE, kv_head, stride_vt, stride_vh, od, dmask)
        v = v.to(q.dtype)
        m, l, acc = _online_softmax(s, v, m, l, acc, PRECISION)

    has = l > 0.0
    out = acc / tl.where(has, l, 1.0)[:, None]
    lse = tl.where(has, m + tl.log2(tl.where(has, l, 1.0)), float("-inf"))
    base = (req * GROUP * tl.num_programs(1) + heads) * num_splits + split
    tl.store(part_lse + base, lse, mask=hmask)
    tl.store(part_out + base[:, None] * D + od[None, :], out, mask=hmask[:, None] & dmask[None, :])


@triton.jit(do_not_specialize=["num_splits"])  # follows the batch size: no variant per size
def _combine_splits_kernel(
    part_out, part_lse, out_ptr, stride_ot, stride_oh, num_splits,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    head = tl.program_id(0)
    req = tl.program_id(1).to(tl.int64)
    base = (req * tl.num_programs(0) + head) * num_splits
    os = tl.arange(0, BLOCK_S)
    od = tl.arange(0, BLOCK_D)
    smask = os < num_splits
    dmask = od < D
    lse = tl.load(part_lse + base + os, mask=smask, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a zero-length request: every split empty
    w = tl.exp2(lse - top)
    total = tl.sum(w, axis=0)
    parts = tl.load(part_out + (base + os)[:, None] * D + od[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + req * stride_ot + head * stride_oh + od, out.to(out_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _paged_extend_kernel(
    q_ptr, k_cache, v_cache, k_desc, v_desc, table_ptr, rows_ptr, seqlen_ptr, cu_ptr, out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_table, qk_scale,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    # Rows of the query tile are (token, head-in-group) pairs: TOKENS tokens x GROUP heads. Blocks
    # run last first: the last tokens of a fresh prompt see the most keys, so the longest programs
    # start first and the short ones fill the tail of the wave.
    block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    req = tl.program_id(2).to(tl.int64)
    q_start = tl.load(cu_ptr + req).to(tl.int64)
    extend = tl.load(cu_ptr + req + 1).to(tl.int64) - q_start
    # The grid is sized for the longest extend in the batch; a shorter one's spare blocks (most of
    # them when decodes ride along with a prefill chunk) must not scan its whole context for nothing.
    if block * TOKENS >= extend:
        return
    seq_len = tl.load(seqlen_ptr + req).to(tl.int64)
    prefix = seq_len - extend
    row = tl.load(rows_ptr + req).to(tl.int64) * stride_table

    r = tl.arange(0, BLOCK_M)
    tok = block * TOKENS + r // GROUP
    heads = kv_head * GROUP + r % GROUP
    rmask = (r < TOKENS * GROUP) & (tok < extend)
    od = tl.arange(0, BLOCK_D)
    dmask = od < D
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh + od[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    q_pos = prefix + tok  # query at absolute position q_pos sees keys at positions <= q_pos

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Key tiles wholly at or before the block's first query position need no causal mask and lie
    # inside the request: no masks, one page lookup a tile. The rest (at most the block's own
    # tokens' span, rounded out to tiles) take the masked step.
    # int32 positions: TMA takes int32 coordinates (a cache holds fewer than 2^31 positions).
    full_end = ((prefix + block * TOKENS + 1) // BLOCK_N * BLOCK_N).to(tl.int32)
    for start in range(0, full_end, BLOCK_N):
        k = _page_tile(k_cache, k_desc, table_ptr, row, start, PAGE_SIZE, BLOCK_N, kv_head, stride_kt, stride_kh,
                       od, dmask, D, D == BLOCK_D, TMA)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION)
        v = _page_tile(v_cache, v_desc, table_ptr, row, start, PAGE_SIZE, BLOCK_N, kv_head, stride_vt, stride_vh,
                       od, dmask, D, D == BLOCK_D, TMA).to(q.dtype)
        m, l, acc = _unmasked_softmax_step(s, v, m, l, acc, qk_scale, PRECISION)
    end = tl.minimum(prefix + (block + 1) * TOKENS, seq_len)
    for start in range(full_end, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pmask = pos < end
        k = _kv_tile(k_cache, table_ptr, row, pos, pmask, PAGE_SIZE, kv_head, stride_kt, stride_kh, od, dmask)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * qk_scale
        # Masked-out rows (past the request's tokens) see no key here; their output is never stored.
        s = tl.where(pmask[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        v = _kv_tile(v_cache, table_ptr, row, pos, pmask, PAGE_SIZE, kv_head, stride_vt, stride_vh, od, dmask)
        v = v.to(q.dtype)
        m, l, acc = _online_softmax(s, v, m, l, acc, PRECISION)
    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
    tl.store(out_ptr + (q_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh + od[None, :],
             out.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, page_table: torch.Tensor) -> tuple[int, int, str]:
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    if heads % kv_heads or k_cache.shape[2] != dim:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache {tuple(k_cache.shape)}")
    if q.stride(2) != 1 or k_cache.stride(2) != 1 or page_table.stride(1) != 1:
        raise ValueError("q, the caches and the page table need a contiguous last dimension")
    # fp32 (tests) gets exact fp32 products; bf16/fp16 run on the tensor cores either way.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    return heads // kv_heads, kv_heads, precision


# Shared memory the pipelined K and V tiles may take (227 KB per block on Hopper, leaving room for
# the query tile and layout conversions).
_TILE_SMEM_BYTES = 128 * 1024


def _fit_block_n(block_n: int, block_d: int, itemsize: int, num_stages: int) -> int:
    """Halve the KV tile until num_stages copies of the K and V tiles fit the budget."""
    while block_n > 16 and 2 * num_stages * block_n * block_d * itemsize > _TILE_SMEM_BYTES:
        block_n //= 2
    return block_n


def extend_tma_fits(cache: torch.Tensor, page_size: int, block_n: int) -> bool:
    """Whether the extend kernel can read `cache`'s whole-page key or value tiles through TMA: tiles
    inside one page, whole power-of-two heads, the cache contiguous with 16-byte aligned rows."""
    positions, kv_heads, dim = cache.shape
    return (page_size % block_n == 0 and dim == triton.next_power_of_2(dim) and cache.is_contiguous()
            and kv_heads * dim * cache.element_size() % 16 == 0 and cache.data_ptr() % 16 == 0
            and positions < 2**31)


@functools.cache
def _has_tma(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _cache_descriptor(cache: torch.Tensor, block_n: int) -> object:
    """A TMA descriptor over the cache as [positions, Hkv * D], in [block_n, D] boxes (one head's tile)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(cache.view(cache.shape[0], -1), [block_n, cache.shape[2]])


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def default_num_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """Enough (request, kv-head, split) programs for about two waves; depends on the batch shape
    only, never on lengths, so a captured graph stays valid as its requests grow."""
    return max(1, min(32, math.ceil(2 * _multiprocessors(device) / (batch * kv_heads))))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    table_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """One query token per request: q [B, Hq, D] at position seq_lens[i] - 1 -> [B, Hq, D]."""
    group, kv_heads, precision = _check_shapes(q, k_cache, page_table)
    batch, heads, dim = q.shape
    splits = num_splits or default_num_splits(batch, kv_heads, q.device)
    block_d = triton.next_power_of_2(dim)
    # An FP8 cache's tiles become q's dtype in registers: the wider of the two sizes the tile.
    block_n = _fit_block_n(block_n, block_d, max(q.element_size(), k_cache.element_size()), num_stages)
    part_out = torch.empty(batch, heads, splits, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(splits, kv_heads, batch)](
        q, k_cache, v_cache, page_table, table_rows, seq_lens, part_out, part_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        page_table.stride(0), scale * _LOG2E,
        PAGE_SIZE=page_size, GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_D=block_d,
        BLOCK_N=block_n, PRECISION=precision, num_warps=num_warps, num_stages=num_stages,
    )
    out = torch.empty_like(q) if out is None else out
    _combine_splits_kernel[(heads, batch)](
        part_out, part_lse, out, out.stride(0), out.stride(1), splits,
        D=dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(splits),
    )
    return out


def extend_tiling(group: int, dim: int, itemsize: int) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) of the extend kernel by default.

    16-bit, head dim >= 128: 128 query rows x 64 keys, 8 warps, 2 stages. On the H200
    (benchmarks/bench_extend_attention.py, docs/benchmarks.md) it was the fastest of 12 tilings at
    every Qwen3.5 35B/122B step measured: 2.1-2.6x the former 64 x 32 x 8 warps x 3 stages, and as
    fast as torch's flash SDPA on the same work laid out contiguously once a prefix is cached. Half
    the rows or keys per tile left the tensor cores short of work per K/V load; 4 warps cannot hold
    a 128 x 256 fp32 accumulator. fp32 (tests) and small heads keep the smaller tile that fits."""
    block_d = triton.next_power_of_2(dim)
    if itemsize <= 2 and dim >= 128:
        block_m, block_n, num_warps, num_stages = 128, 64, 8, 2
    else:
        block_m, block_n, num_warps, num_stages = 64, 32, 8 if dim >= 128 else 4, 3
    block_n = _fit_block_n(block_n, block_d, itemsize, num_stages)
    return max(block_m, triton.next_power_of_2(group)), block_n, num_warps, num_stages


def paged_extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    table_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_extend: int,
    page_size: int,
    scale: float,
    out: torch.Tensor | None = None,
    tiling: tuple[int, int, int, int] | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] varlen (cu_seqlens [B+1]); request i's queries sit at the last
    extend_i positions of its seq_lens[i] tokens and attend causally to all of them -> [T, Hq, D].
    `tiling` (block_m, block_n, num_warps, num_stages) overrides extend_tiling's (benchmarks).
    `tma`: whole-page K/V tiles through TMA (None: where the caches allow it on Hopper and later,
    1.09-1.18x on the H200 at Qwen3.5's prefill steps, docs/benchmarks.md; True: required)."""
    group, kv_heads, precision = _check_shapes(q, k_cache, page_table)
    dim = q.shape[2]
    # An FP8 cache's tiles become q's dtype in registers: q's width picks the tiling.
    itemsize = max(q.element_size(), k_cache.element_size())
    block_m, block_n, num_warps, num_stages = tiling or extend_tiling(group, dim, itemsize)
    if block_m < group:
        raise ValueError(f"paged_extend: block_m {block_m} must hold a whole query group of {group} heads")
    fits = all(extend_tma_fits(c, page_size, block_n) for c in (k_cache, v_cache))
    if tma and not fits:
        raise ValueError(f"paged_extend: caches {tuple(k_cache.shape)} in pages of {page_size} cannot be read "
                         f"through TMA in tiles of {block_n} keys (see extend_tma_fits)")
    use_tma = fits and (_has_tma(q.device) if tma is None else tma)
    k_desc, v_desc = (_cache_descriptor(c, block_n) if use_tma else c for c in (k_cache, v_cache))
    tokens_per_block = block_m // group
    out = torch.empty_like(q) if out is None else out
    grid = (triton.cdiv(max_extend, tokens_per_block), kv_heads, cu_seqlens.shape[0] - 1)
    _paged_extend_kernel[grid](
        q, k_cache, v_cache, k_desc, v_desc, page_table, table_rows, seq_lens, cu_seqlens, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), page_table.stride(0), scale * _LOG2E,
        PAGE_SIZE=page_size, GROUP=group, TOKENS=tokens_per_block, BLOCK_M=block_m, D=dim,
        BLOCK_D=triton.next_power_of_2(dim), BLOCK_N=block_n, PRECISION=precision, TMA=use_tma,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
