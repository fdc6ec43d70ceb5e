"""unholdable: the values a request may not carry to the engine, found in nested bodies and in
token-id lists checked in bulk."""
from minisgl.server.admission import INT_MAX, INT_MIN, unholdable


def test_token_ids_within_64_bits_pass_in_bulk() -> None:
    assert unholdable(list(range(4096)), "prompt") is None
    assert unholdable([INT_MIN, 0, INT_MAX], "prompt") is None
    assert unholdable((1, 2, 3), "prompt") is None


def test_an_out_of_range_id_is_named_by_its_index() -> None:
    ids = list(range(100))
    ids[57] = INT_MAX + 1
    assert unholdable(ids, "prompt") == ("prompt[57]", f"{INT_MAX + 1} does not fit in 64 bits")
    ids[57] = INT_MIN - 1
    assert unholdable(ids, "prompt")[0] == "prompt[57]"
    assert unholdable(ids, "prompt", ints=False) is None  # texts only: integers are not checked


def test_mixed_lists_are_walked_element_by_element() -> None:
    assert unholdable([1, "a\ud800b"], "stop")[0] == "stop[1]"
    assert unholdable([True, 2**70], "x") == ("x[1]", f"{2**70} does not fit in 64 bits")
    assert unholdable([[1, 2], [3, 2**64]], "prompt")[0] == "prompt[1][1]"
