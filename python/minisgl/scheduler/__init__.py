"""Requests, admission by pages and state slots, continuous batching with chunked prefill."""
