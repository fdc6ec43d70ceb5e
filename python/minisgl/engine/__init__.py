"""The engine: device, model, pools and backends; forward_batch(batch) -> logits."""
