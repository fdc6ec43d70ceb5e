"""MoE: router, expert compute backends, and the MoE blocks the decoder layers call."""
