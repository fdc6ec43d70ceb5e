"""Page arithmetic. This is the only place that turns token counts into page counts."""


def _num_pages(tokens: int, page_size: int) -> int:
    """Pages needed to hold `tokens` tokens: ceil(tokens / page_size)."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    if tokens < 0:
        raise ValueError(f"token count must be non-negative, got {tokens}")
    return -(-tokens // page_size)
