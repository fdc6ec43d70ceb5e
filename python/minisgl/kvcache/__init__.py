"""Paged KV for full-attention layers, per-request recurrent state for GDN layers, one allocator."""
