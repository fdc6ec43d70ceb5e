"""The CUDA-graph runner's table and padding logic, testable without a GPU."""
from __future__ import annotations

import pytest
import torch

from minisgl.engine.graph import StaticDecodeInputs, check_table_width, decode_buckets
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import DUMMY_PAGE, HybridPool, PoolConfig, PoolLayout
from minisgl.kvcache.pages import _num_pages


def test_buckets() -> None:
    assert decode_buckets(1) == [1]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert decode_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    with pytest.raises(ValueError):
        decode_buckets(0)


def test_unaligned_max_seq_len_table_width() -> None:
    layout = PoolLayout(full_layers=(0,), num_kv_heads=1, head_dim=4)
    pool = HybridPool(layout, PoolConfig(max_running_requests=2, max_seq_len=8505, page_size=64), torch.float32, "cpu")
    assert pool.page_table.shape[1] == _num_pages(8505, 64) == 133
    check_table_width(pool.page_table, 133)  # equal: fine
    check_table_width(pool.page_table[:, :100], 133)  # narrower: every page still reachable
    with pytest.raises(ValueError, match="134 columns but the decode graphs were captured for 133"):
        check_table_width(torch.zeros(3, 134, dtype=torch.int32), 133)


def test_static_inputs_copy_and_pad_with_dummies() -> None:
    layout = PoolLayout(full_layers=(0,), num_kv_heads=1, head_dim=4)
    pool = HybridPool(layout, PoolConfig(max_running_requests=8, max_seq_len=300, page_size=16), torch.float32, "cpu")
    slots = [pool.allocate(200) for _ in range(3)]
    lens = [5, 130, 199]
    for s, n in zip(slots, lens):
        pool.ensure_tokens(s, n + 1)
    batch = ForwardBatch.build([[7], [8], [9]], lens, slots, pool.page_table, 16, "cpu")
    inputs = StaticDecodeInputs(8, pool.dummy_row, pool.page_size, torch.device("cpu"))
    inputs.load(batch, bucket=4)
    static = inputs.batch(4)
    assert static.input_ids.tolist() == [7, 8, 9, 0]
    assert static.positions.tolist() == lens + [0]
    assert static.slots.tolist() == slots + [0]
    assert static.table_rows.tolist() == [s - 1 for s in slots] + [pool.dummy_row]
    assert static.seq_lens.tolist() == [n + 1 for n in lens] + [1]
    assert static.cache_loc[:3].tolist() == batch.cache_loc.tolist()
    # The padding row writes position 0 of the dummy row: the dummy page, owned by nobody.
    assert static.cache_loc[3].item() == DUMMY_PAGE * 16
    assert bool((pool.page_table[pool.dummy_row] == DUMMY_PAGE).all())
    with pytest.raises(ValueError, match="only decode batches"):
        inputs.load(ForwardBatch.build([[1, 2]], [0], [slots[0]], pool.page_table, 16, "cpu"), 4)
