"""Triton paged attention (split-KV decode, varlen extend) against TorchAttentionBackend."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import DEVICE, TOL, assert_close, poisoned

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.attention.paged_kv import PagedKV, cache_values
from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.attention.torch_backend import TorchAttentionBackend
from minisgl.forward_batch import ForwardBatch
from minisgl.kernels.fp8_format import FP8_DTYPE
from minisgl.kernels.paged_attention import extend_tiling, extend_tma_fits, paged_decode, paged_extend
from minisgl.kvcache.kv_pool import KVPool

pytestmark = pytest.mark.gpu

MAX_RUNNING = 6
# (Hq, Hkv, D, page_size): tiny models' GQA 2:1 at small head dims, and 122B's 32:2 at D=256.
CONFIGS = [(4, 2, 64, 16), (4, 2, 32, 64), (32, 2, 256, 16), (32, 2, 256, 64)]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def paged_pool(kv_heads: int, dim: int, page_size: int, max_len: int, dtype: torch.dtype) -> PagedKV:
    """Random caches (so stray reads and writes show) and table rows of shuffled distinct pages;
    the last row is the dummy, pointing at page 0."""
    width = -(-max_len // page_size)
    pages = MAX_RUNNING * width + 1
    table = torch.zeros(MAX_RUNNING + 1, width, dtype=torch.int32, device=DEVICE)
    table[:MAX_RUNNING] = (torch.randperm(pages - 1, device=DEVICE) + 1).view(MAX_RUNNING, width).int()
    k = torch.randn(pages * page_size, kv_heads, dim, dtype=dtype, device=DEVICE)
    v = torch.randn(pages * page_size, kv_heads, dim, dtype=dtype, device=DEVICE)
    return PagedKV(k, v, table, page_size)


def run_reference(pool: PagedKV, prefix: list[int], extend: list[int], heads: int, dtype: torch.dtype):
    """Batch over slots 1..B, its q/k/v, and the reference output, with the new K/V written to the pool."""
    tokens = [[0] * n for n in extend]
    batch = ForwardBatch.build(tokens, prefix, list(range(1, len(prefix) + 1)), pool.page_table, pool.page_size, DEVICE)
    kv_heads, dim = pool.k_cache.shape[1:]
    q = torch.randn(batch.num_tokens, heads, dim, dtype=dtype, device=DEVICE)
    k = torch.randn(batch.num_tokens, kv_heads, dim, dtype=dtype, device=DEVICE)
    v = torch.randn(batch.num_tokens, kv_heads, dim, dtype=dtype, device=DEVICE)
    ref = TorchAttentionBackend().forward(q, k, v, pool, batch, dim**-0.5)
    return batch, (q, k, v), ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_paged_decode(config: tuple[int, int, int, int], dtype: torch.dtype) -> None:
    heads, kv_heads, dim, page_size = config
    prefix = [0, 1, 63, 64, 300, 1000]  # page boundaries, a first token, a long context
    pool = paged_pool(kv_heads, dim, page_size, 1024, dtype)
    batch, (q, _, _), ref = run_reference(pool, prefix, [1] * len(prefix), heads, dtype)
    k_before, v_before = pool.k_cache.clone(), pool.v_cache.clone()
    for splits in (None, 1, 7):
        out = paged_decode(
            q, pool.k_cache, pool.v_cache, pool.page_table, batch.table_rows, batch.seq_lens, page_size, dim**-0.5,
            out=poisoned(*q.shape, dtype=dtype), num_splits=splits,
        )
        assert_close(out, ref, TOL[dtype], f"decode output, {splits} splits")
    assert torch.equal(pool.k_cache, k_before) and torch.equal(pool.v_cache, v_before), "decode wrote the cache"


def test_paged_decode_padding_rows() -> None:
    """A padded row (dummy table row, length 0) outputs zeros, not NaN, and leaves real rows alone."""
    pool = paged_pool(2, 64, 16, 256, torch.float32)
    batch, (q, _, _), ref = run_reference(pool, [10, 200], [1, 1], 4, torch.float32)
    rows = torch.cat([batch.table_rows, torch.tensor([MAX_RUNNING], device=DEVICE)])
    lens = torch.cat([batch.seq_lens, torch.zeros(1, dtype=torch.int32, device=DEVICE)])
    q = torch.cat([q, torch.randn(1, 4, 64, device=DEVICE)])
    out = poisoned(*q.shape, dtype=q.dtype)
    paged_decode(q, pool.k_cache, pool.v_cache, pool.page_table, rows, lens, 16, 64**-0.5, out=out)
    assert_close(out[:2], ref, 1e-3, "real rows")
    assert (out[2] == 0).all()


def extend_or_refusal(pool: PagedKV, q: torch.Tensor, batch: ForwardBatch, extend: list[int], tma: bool):
    """paged_extend's output with TMA on or off; None where TMA was asked for and the caches cannot
    take it, after checking that paged_extend refuses rather than reading tiles that span pages."""
    heads, dim = q.shape[1:]
    block_n = extend_tiling(heads // pool.k_cache.shape[1], dim, q.element_size())[1]
    args = (q, pool.k_cache, pool.v_cache, pool.page_table, batch.table_rows, batch.seq_lens, batch.cu_seqlens,
            max(extend), pool.page_size, dim**-0.5)
    if tma and not extend_tma_fits(pool.k_cache, pool.page_size, block_n):
        assert pool.page_size % block_n, "these configs' caches fit TMA but for tiles spanning pages"
        with pytest.raises(ValueError, match="TMA"):
            paged_extend(*args, tma=True)
        return None
    return paged_extend(*args, out=poisoned(*q.shape, dtype=q.dtype), tma=tma)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_paged_extend(config: tuple[int, int, int, int], dtype: torch.dtype, tma: bool) -> None:
    heads, kv_heads, dim, page_size = config
    prefix = [0, 0, 17, 64, 250, 3]
    extend = [1, 70, 5, 64, 130, 1]  # fresh prefills, chunked extends over a cached prefix, decodes mixed in
    pool = paged_pool(kv_heads, dim, page_size, 512, dtype)
    batch, (q, _, _), ref = run_reference(pool, prefix, extend, heads, dtype)
    k_before = pool.k_cache.clone()
    out = extend_or_refusal(pool, q, batch, extend, tma)
    if out is not None:
        assert_close(out, ref, TOL[dtype], "extend output")
    assert torch.equal(pool.k_cache, k_before), "extend wrote the cache"


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_extend_long_prefix(page_size: int, dtype: torch.dtype, tma: bool) -> None:
    """Long cached prefixes, so most key tiles take the unmasked loop (one page lookup a tile at
    pages of 64, per-key lookups at 16), with cached keys scaled by a log-normal factor a row so the
    running max jumps by large steps at random tiles."""
    heads, kv_heads, dim = 32, 2, 256
    prefix, extend = [1000, 1500, 0, 1983], [200, 37, 300, 1]
    pool = paged_pool(kv_heads, dim, page_size, 2048, dtype)
    pool.k_cache.mul_(torch.exp(1.5 * torch.randn(pool.k_cache.shape[0], 1, 1, device=DEVICE)).to(dtype))
    batch, (q, _, _), ref = run_reference(pool, prefix, extend, heads, dtype)
    out = extend_or_refusal(pool, q, batch, extend, tma)
    if out is not None:
        assert_close(out, ref, TOL[dtype], "extend output over a long prefix")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
def test_extend_tma_reads_a_pool_layer(cache_dtype: torch.dtype) -> None:
    """The pool hands the kernel each layer's caches as views at an offset into one K and one V
    buffer (kvcache/kv_pool.py); TMA reads them there, bf16 and 1-byte FP8 codes alike."""
    heads, kv_heads, dim, page_size = CONFIGS[3]
    prefix, extend = [700, 0, 130], [40, 9, 200]
    src = paged_pool(kv_heads, dim, page_size, 1024, torch.bfloat16)
    store = KVPool((0, 1, 2), src.k_cache.shape[0] // page_size, page_size, kv_heads, dim, cache_dtype, DEVICE)
    k_cache, v_cache = store.layer(1)
    assert k_cache.data_ptr() != store.k.data_ptr() and v_cache.data_ptr() != store.v.data_ptr()
    k_cache.copy_(cache_values(src.k_cache * 8, cache_dtype))
    v_cache.copy_(cache_values(src.v_cache * 8, cache_dtype))
    layer = PagedKV(k_cache, v_cache, src.page_table, page_size)
    batch, (q, k, v), _ = run_reference(src, prefix, extend, heads, torch.bfloat16)
    ref = TorchAttentionBackend().forward(q, k, v, layer, batch, dim**-0.5)  # writes the new K/V into the layer
    out = paged_extend(q, k_cache, v_cache, src.page_table, batch.table_rows, batch.seq_lens, batch.cu_seqlens,
                       max(extend), page_size, dim**-0.5, out=poisoned(*q.shape, dtype=q.dtype), tma=True)
    assert_close(out, ref, TOL[torch.bfloat16], f"extend through TMA over a pool layer of {cache_dtype}")


@pytest.mark.parametrize("decode", [True, False])
def test_triton_backend(decode: bool) -> None:
    """The registered backend writes the new K/V exactly where the reference does and agrees with it."""
    heads, kv_heads, dim, page_size = CONFIGS[2]
    prefix = [5, 100, 0]
    extend = [1, 1, 1] if decode else [3, 40, 9]
    pool = paged_pool(kv_heads, dim, page_size, 256, torch.bfloat16)
    k0, v0 = pool.k_cache.clone(), pool.v_cache.clone()
    batch, (q, k, v), ref = run_reference(pool, prefix, extend, heads, torch.bfloat16)
    backend = ATTENTION_BACKENDS.get("triton")()
    out = backend.forward(q, k, v, PagedKV(k0, v0, pool.page_table, page_size), batch, dim**-0.5)
    assert torch.equal(k0, pool.k_cache) and torch.equal(v0, pool.v_cache), "cache writes differ from the reference"
    assert_close(out, ref, TOL[torch.bfloat16], "backend output")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("decode", [True, False])
def test_fp8_cache(decode: bool, dtype: torch.dtype) -> None:
    """--kv-cache-dtype fp8_e4m3: the kernels read e4m3 codes (a scale of 1) into q's dtype. The
    reference reads the same codes, so the kernels' error is their own arithmetic's: the
    tolerance of q's dtype, as for a cache in q's dtype. The new K/V include values past 448,
    which the cache holds saturated."""
    heads, kv_heads, dim, page_size = CONFIGS[3]
    prefix = [5, 100, 0, 700]
    extend = [1] * 4 if decode else [3, 40, 9, 1]
    pool = paged_pool(kv_heads, dim, page_size, 1024, dtype)
    fp8 = PagedKV(cache_values(pool.k_cache * 8, FP8_DTYPE), cache_values(pool.v_cache * 8, FP8_DTYPE),
                  pool.page_table, page_size)
    batch, (q, k, v), _ = run_reference(pool, prefix, extend, heads, dtype)
    k[0, 0, :4] = torch.tensor([1e4, -1e4, 500.0, -449.0])  # saturate to +-448
    ref = TorchAttentionBackend().forward(q, k, v, fp8, batch, dim**-0.5)
    assert fp8.k_cache.dtype == FP8_DTYPE and not fp8.k_cache.float().isnan().any()
    assert fp8.k_cache[batch.cache_loc[0], 0, :4].float().tolist() == [448.0, -448.0, 448.0, -448.0]
    out = ATTENTION_BACKENDS.get("triton")().forward(q, k, v, fp8, batch, dim**-0.5)
    assert_close(out, ref, TOL[dtype], "output over an FP8 cache")
