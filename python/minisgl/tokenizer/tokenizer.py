"""The model's HF tokenizer, loaded offline from the checkpoint directory."""
from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {model_path!r}: {e}") from e
