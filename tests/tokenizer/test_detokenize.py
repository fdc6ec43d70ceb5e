"""Incremental detokenization never emits half a character; stop strings never leak into a stream;
logprob token texts carry raw bytes."""
from __future__ import annotations

import pytest

from minisgl.scheduler.stop import first_stop
from minisgl.tokenizer.detokenizer import IncrementalDetokenizer, TextStream
from minisgl.tokenizer.token_text import TokenTexts
from minisgl.tokenizer.tokenizer import load_tokenizer

TEXT = "Héllo wörld: 中文字符 and emoji 🙂🚀, then plain ascii again. ½ ∑ Ω"


@pytest.fixture(scope="module")
def tok(tiny_checkpoints):
    return load_tokenizer(tiny_checkpoints["bf16"])


def test_multibyte_characters_span_tokens(tok) -> None:
    ids = tok.encode(TEXT)
    # The premise: some tokens alone are partial UTF-8 (the byte-level vocab has no CJK merges).
    assert any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_incremental_matches_full_decode_and_is_utf8_safe(tok, step: int) -> None:
    ids = tok.encode(TEXT)
    d = IncrementalDetokenizer(tok)
    deltas = [d.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    deltas.append(d.flush())
    assert all("\ufffd" not in x for x in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_flush_emits_a_truncated_character(tok) -> None:
    ids = tok.encode("中")
    d = IncrementalDetokenizer(tok)
    assert d.push(ids[:-1]) == ""
    assert d.flush() == tok.decode(ids[:-1])


def test_special_tokens_skipped_or_kept(tok) -> None:
    ids = tok.encode("a<|im_end|>b")
    assert "".join(IncrementalDetokenizer(tok, True).push([i]) for i in ids) == "ab"
    assert "".join(IncrementalDetokenizer(tok, False).push([i]) for i in ids) == "a<|im_end|>b"


def test_stream_holds_back_a_possible_stop_string(tok) -> None:
    ids = tok.encode("The answer is 42. STOP here")
    s = TextStream(tok, True, ["STOP", "xyz"])
    sent = ""
    for k in range(len(ids)):
        done = "STOP" in tok.decode(ids[: k + 1])  # where the scheduler would finish the request
        sent += s.push(ids[k : k + 1], finished=done)
        if done:
            break
        assert "S" not in sent  # "S", "ST", "STO" may begin the stop string: held back
    assert sent == "The answer is 42. "


def test_stream_without_stops_emits_everything(tok) -> None:
    ids = tok.encode(TEXT)
    s = TextStream(tok, True, [])
    out = "".join(s.push([i], finished=False) for i in ids) + s.push([], finished=True)
    assert out == TEXT


def test_first_stop() -> None:
    assert first_stop("abcXdefY", ["Y", "X"], 0) == (3, "X")
    assert first_stop("abc", ["Z"], 0) is None
    # Only occurrences that end past new_from count: "X" at 3 was complete before 5; "fY" straddles it.
    assert first_stop("abcXdefY", ["X", "fY"], 5) == (6, "fY")
    assert first_stop("abcXdefY", ["X"], 5) is None


def test_stream_ignores_stops_inside_min_tokens(tok) -> None:
    ids = [tok.convert_tokens_to_ids(c) for c in "aXbXc"]  # one byte-level token per letter
    assert tok.decode(ids) == "aXbXc"
    assert TextStream(tok, True, ["X"]).push(ids, finished=True) == "a"
    assert TextStream(tok, True, ["X"], min_tokens=2).push(ids, finished=True) == "aXb"
    streamed = TextStream(tok, True, ["X"], min_tokens=2)
    assert "".join(streamed.push([i], finished=k == 3) for k, i in enumerate(ids[:4])) == "aXb"


def test_token_texts_carry_bytes(tok) -> None:
    texts = TokenTexts(tok)
    ids = tok.encode("中🙂a")
    raw = b"".join(bytes(texts.get(i)[1]) for i in ids)
    assert raw.decode() == "中🙂a"
    partial = [texts.get(i)[0] for i in ids if "\ufffd" in tok.decode([i])]
    assert partial and all(t.startswith("bytes:\\x") for t in partial)
    assert texts.get(tok.convert_tokens_to_ids("<|im_end|>"))[0] == "<|im_end|>"


