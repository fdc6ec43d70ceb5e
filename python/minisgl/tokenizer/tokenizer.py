"""The model's HF tokenizer, loaded offline from the checkpoint directory."""
from __future__ import annotations

import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase

# A checkpoint's tokenizer is one of these (fast JSON, sentencepiece, BPE vocabulary, tiktoken).
# Without any, transformers still builds the config's tokenizer class with an empty vocabulary,
# which encodes every text to nothing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


def check_has_tokenizer(model_path: str) -> None:
    if not any(os.path.isfile(os.path.join(model_path, name)) for name in TOKENIZER_FILES):
        raise ValueError(f"{model_path!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}) (hint: copy "
                         f"the tokenizer files of the original checkpoint there)")


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    if os.path.isdir(model_path):
        check_has_tokenizer(model_path)
    try:
        return AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {model_path!r}: {e}") from e
