"""Requests, admission by pages and state slots, continuous batching with chunked prefill, and the
overlap loop. Drivers (the engine process, the offline LLM) see only the RequestScheduler protocol
(protocol.py) and the messages in messages.py, so the AFD coordinator can stand in for Scheduler."""
