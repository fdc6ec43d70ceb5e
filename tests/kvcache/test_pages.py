import pytest
import torch

from minisgl.kvcache.hybrid_pool import DUMMY_PAGE, HybridPool, PoolConfig, PoolExhausted, PoolLayout
from minisgl.kvcache.pages import _num_pages

LAYOUT = PoolLayout(
    full_layers=(3,), num_kv_heads=2, head_dim=8, linear_layers=(0, 1, 2), conv_dim=12, conv_kernel=4,
    num_value_heads=2, key_head_dim=4, value_head_dim=4,
)


@pytest.mark.parametrize(
    "tokens,page,expected",
    [(0, 64, 0), (1, 64, 1), (63, 64, 1), (64, 64, 1), (65, 64, 2), (8505, 64, 133), (8448, 64, 132), (7, 1, 7)],
)
def test_num_pages(tokens: int, page: int, expected: int) -> None:
    assert _num_pages(tokens, page) == expected


def test_num_pages_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        _num_pages(10, 0)
    with pytest.raises(ValueError):
        _num_pages(-1, 64)


def test_table_shape_for_unaligned_max_seq_len() -> None:
    pool = HybridPool(LAYOUT, PoolConfig(max_running_requests=3, max_seq_len=8505, page_size=64), torch.float32, "cpu")
    assert tuple(pool.page_table.shape) == (4, 133)  # max_running + 1 dummy row
    slot = pool.allocate(8505)
    pool.ensure_tokens(slot, 8505)  # the last token needs the 133rd page
    row = pool.page_table[pool.row(slot)]
    assert bool((row != DUMMY_PAGE).all())
    assert len(set(row.tolist())) == 133
    pool.free(slot)
    pool.check_integrity()
    assert pool.free_pages == pool.total_pages


def test_state_shapes_and_dtypes() -> None:
    pool = HybridPool(
        LAYOUT, PoolConfig(max_running_requests=5, max_seq_len=100, page_size=16, ssm_dtype="float32"),
        torch.bfloat16, "cpu",
    )
    assert tuple(pool.state.conv.shape) == (3, 6, 12, 3) and pool.state.conv.dtype == torch.bfloat16
    assert tuple(pool.state.ssm.shape) == (3, 6, 2, 4, 4) and pool.state.ssm.dtype == torch.float32
    assert tuple(pool.kv.k.shape) == (1, (5 * 7 + 1) * 16, 2, 8)


def test_allocation_reserves_and_returns_everything() -> None:
    pool = HybridPool(LAYOUT, PoolConfig(max_running_requests=4, max_seq_len=64, page_size=8, num_pages=10), torch.float32, "cpu")
    a = pool.allocate(40)  # reserves 5 pages
    assert pool.available_pages == 5 and pool.free_pages == 10
    pool.ensure_tokens(a, 9)
    assert pool.free_pages == 8 and pool.available_pages == 5
    b = pool.allocate(40)
    assert not pool.can_allocate(1)  # every page is promised
    with pytest.raises(PoolExhausted):
        pool.allocate(1)
    with pytest.raises(PoolExhausted):
        pool.ensure_tokens(a, 41)  # beyond its reservation
    pool.check_integrity()
    pool.free(a)
    pool.free(b)
    pool.check_integrity()
    assert pool.free_pages == 10 and pool.free_slots == 4 and pool.available_pages == 10


def test_new_slot_state_is_zeroed() -> None:
    pool = HybridPool(LAYOUT, PoolConfig(max_running_requests=2, max_seq_len=32, page_size=8), torch.float32, "cpu")
    s = pool.allocate(8)
    pool.state.conv[:, s].normal_()
    pool.state.ssm[:, s].normal_()
    pool.free(s)
    s2 = pool.allocate(8)
    assert s2 == s
    assert not pool.state.conv[:, s2].any() and not pool.state.ssm[:, s2].any()


def test_integrity_check_catches_a_leak() -> None:
    pool = HybridPool(LAYOUT, PoolConfig(max_running_requests=2, max_seq_len=32, page_size=8), torch.float32, "cpu")
    s = pool.allocate(16)
    pool.ensure_tokens(s, 16)
    pool.allocator._pages[s].pop()  # a page lost from the books
    with pytest.raises(AssertionError, match="page pool corrupt"):
        pool.check_integrity()


def test_pool_config_rejects_a_pool_too_small_for_one_request() -> None:
    with pytest.raises(ValueError, match="cannot hold even one request"):
        PoolConfig(max_running_requests=2, max_seq_len=100, page_size=16, num_pages=3)
