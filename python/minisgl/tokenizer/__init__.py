"""Tokenizer loading (HF tokenizers), decoding and chat templates."""
