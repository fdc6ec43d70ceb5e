"""A tiny byte-level BPE tokenizer with Qwen-style chat specials, for the tiny models.

Byte-level BPE covers every UTF-8 string, so any prompt (including non-ASCII) round-trips even
though the merges are learnt from one short English paragraph and one short Python snippet.
"""
from __future__ import annotations

import json
import os
from importlib.resources import files

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Single tokens the Qwen3.5 model emits as text (not special: skip_special_tokens keeps them).
CHAT_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
VOCAB_SIZE = 512  # 256 byte symbols + 3 specials + 247 merges, then the 6 chat tokens (ids 506-511)

# The training text only decides which merges exist; its content is arbitrary.
_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden gate.
In the morning the village wakes slowly: bakers light their ovens, children walk to school, and
the river carries fallen leaves past the mill. A traveller asks the way to the station, and a
kind woman points down the hill, saying that the train leaves at nine and is seldom late.
Numbers such as 1, 2, 3, 10, 42 and 2024 appear in the ledger beside the names of the sellers.
What is the capital of France? The capital of France is Paris. What is two plus two? It is four.
The model reads a question, thinks about the answer, and then writes it down in plain words.
Hello! How are you today? I am fine, thank you, and I hope that you are well too.
"""
# Some Python too, the trained default model's corpus: merges for indentation and common words make
# its text several times shorter in tokens than byte by byte.
_CODE_TEXT = '''\
class Buffer:
    """Hold the lines that were read so far and return them in order."""

    def __init__(self, name, size=None):
        self.name = name
        self.size = size
        self.lines = []

    def add(self, line):
        if line is None:
            raise ValueError("line must not be None")
        self.lines.append(line)
        return len(self.lines)

    def get(self, index, default=None):
        """Return the line at index, or default if there is none."""
        try:
            return self.lines[index]
        except IndexError:
            return default


def read_all(path, encoding="utf-8"):
    # Read the whole file and split it into lines.
    with open(path, encoding=encoding) as f:
        for line in f:
            if not line.strip():
                continue
            yield line.rstrip("\\n")
'''

# The split pattern of the official Qwen3.5 tokenizer.json (single digits, letters with their marks).
# transformers' AutoTokenizer ignores tokenizer_class for qwen3_5_moe checkpoints and rebuilds this
# NFC + split + byte-level pipeline around our vocab, so tokenizer.json must use the same pipeline
# for the raw `tokenizers` library and AutoTokenizer to agree.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = files("minisgl.models.tiny").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def _train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(CHAT_TOKENS),
        min_frequency=1,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        # Every byte must be in the vocab, or unseen characters (é, 中) would have no encoding.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Repeating lines gives frequent pairs clear counts, keeping the learnt merges stable.
    tok.train_from_iterator((_TRAINING_TEXT + _CODE_TEXT).splitlines() * 4, trainer=trainer)
    # Appended after the merges, so every id below them is what it was before these tokens existed.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHAT_TOKENS])
    return tok


def special_token_ids() -> dict[str, int]:
    """Ids of the special tokens; the trainer assigns them first, in SPECIAL_TOKENS order."""
    return {t: i for i, t in enumerate(SPECIAL_TOKENS)}


def build_tiny_tokenizer(out_dir: str) -> None:
    """Write tokenizer.json and tokenizer_config.json, loadable offline by AutoTokenizer.from_pretrained."""
    os.makedirs(out_dir, exist_ok=True)
    tok = _train()
    ids = special_token_ids()
    if any(tok.token_to_id(t) != i for t, i in ids.items()):
        raise RuntimeError("tokenizers assigned unexpected ids to the special tokens")
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        # The generic backend loads tokenizer.json as-is instead of rebuilding a Qwen pre-tokenizer.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {"content": t, "special": t in ids, "lstrip": False, "rstrip": False,
                                      "normalized": False, "single_word": False}
            for t in SPECIAL_TOKENS + CHAT_TOKENS
        },
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
