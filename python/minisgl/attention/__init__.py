"""Full-attention backends over the paged KV pool."""
