"""A byte-level BPE tokenizer with exactly a real model's vocabulary size, written next to a
config-only model directory, so `--load-format dummy` servers detokenize every id the model can
sample and the bench client can draw prompts from the whole vocabulary, with no checkpoint.

The vocabulary is synthetic (the 256 byte symbols, then pairs and triples of printable ASCII
symbols, in a fixed order, with a merge for each), and the special tokens sit at the ids the
model's config names. Printable merges keep almost every id decodable on its own, so streamed
text arrives token by token (an id that decodes to part of a UTF-8 character is held back).
"""
from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# The byte-level symbols of printable ASCII: "!".."~" stand for themselves, "Ġ" for the space.
_PRINTABLE = ["Ġ"] + [chr(b) for b in range(0x21, 0x7F)]


def _merges(alphabet: list[str]) -> Iterator[tuple[str, str]]:
    """(left, right) pairs whose concatenations are all distinct: every pair of symbols, then every
    pair followed by a symbol."""
    pairs = [(a, b) for a, b in itertools.product(alphabet, alphabet)]
    yield from pairs
    for (a, b), c in itertools.product(pairs, alphabet):
        yield a + b, c


def write_full_vocab_tokenizer(out_dir: str, vocab_size: int, first_special_id: int) -> None:
    """tokenizer.json and tokenizer_config.json with `vocab_size` ids; SPECIALS at first_special_id..+2."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    special_ids = {t: first_special_id + i for i, t in enumerate(SPECIALS)}
    free_ids = (i for i in range(vocab_size) if i not in special_ids.values())
    vocab = {sym: next(free_ids) for sym in alphabet}
    merges = []
    for left, right in _merges(_PRINTABLE):
        if len(vocab) + len(SPECIALS) >= vocab_size:
            break
        vocab[left + right] = next(free_ids)
        merges.append((left, right))
    vocab.update(special_ids)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    if tok.get_vocab_size() != vocab_size or any(tok.token_to_id(t) != i for t, i in special_ids.items()):
        raise RuntimeError("the synthetic vocabulary came out the wrong size or with misplaced special tokens")
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for t, i in special_ids.items()},
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
