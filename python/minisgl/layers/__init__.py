"""Model building blocks: linear, norms, rotary embedding."""
