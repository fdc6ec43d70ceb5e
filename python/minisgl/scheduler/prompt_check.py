"""The one rule for a prompt that can never run, worded for users: the server answers it as a 400
on `prompt`, and both schedulers (the offline LLM's path) raise it as a ValueError."""
from __future__ import annotations


def prompt_error(prompt_ids: list[int], max_seq_len: int, vocab_size: int) -> str | None:
    """Why this prompt cannot run, or None when it can."""
    if not prompt_ids:
        return "the prompt is empty"
    if len(prompt_ids) >= max_seq_len:
        return (f"This model's maximum context length is {max_seq_len} tokens, and the prompt has "
                f"{len(prompt_ids)} tokens, leaving no room to generate.")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        return f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})"
    return None
