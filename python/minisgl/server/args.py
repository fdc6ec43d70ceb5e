"""Server flags that are not engine or scheduler flags (SGLang's names where SGLang has one)."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.arg_field import arg, check_choices
from minisgl.server.reasoning import REASONING_PARSERS
from minisgl.server.tool_parser import TOOL_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True)
class ServerArgs:
    host: str = arg("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = arg(30000, "port to listen on; checked before the model loads")
    served_model_name: str | None = arg(None, "the model name /v1/models lists and requests send (default: the "
                                              "model directory's name; minisgl-tiny for the embedded model)")
    watchdog_timeout: float = arg(300.0, "seconds one step may take before the engine counts as hung and is stopped")
    startup_timeout: float = arg(1800.0, "seconds the engine may take to load the model and warm up")
    log_level: str = arg("info", "log level of every process (API server, engine, detokenizer, workers)", LOG_LEVELS)
    log_level_http: str | None = arg(None, "log level of the HTTP server (uvicorn); info or debug also turns on its "
                                           "access log, one line per request (default: --log-level, access log off)",
                                     LOG_LEVELS)
    log_requests: bool = arg(False, "log each request as it arrives (its id, prompt tokens, sampling parameters) "
                                    "and as it finishes (finish reason, tokens, latency, the start of its text)")
    decode_log_interval: int = arg(40, "log an engine stats line (running and queued requests, token usage, "
                                       "generation and prefill throughput, Triton compiles) every this many "
                                       "decode steps; 0 = never")
    reasoning_parser: str | None = arg(None, "qwen3: the <think> block of chat answers goes to reasoning_content",
                                       tuple(REASONING_PARSERS))
    tool_call_parser: str | None = arg(None, "qwen3_coder: enables tools in chat; Qwen3.5 XML tool calls go to "
                                             "tool_calls", tuple(TOOL_PARSERS))
    generation_config: str = arg("auto", "sampling defaults for requests that leave fields unset: auto (the model's "
                                         "generation_config.json), ignore (or vllm: none), or a folder holding one")
    api_key: str | None = arg(None, "require `Authorization: Bearer KEY` on /v1/* and the admin routes (/health, "
                                    "/metrics, /version stay open)")
    max_queued_requests: int | None = arg(1024, "choices that may wait beyond the running slots; more get 503 with "
                                                "Retry-After")
    max_request_body_bytes: int = arg(16 << 20, "larger request bodies get 413")
    body_read_timeout: float = arg(30.0, "seconds a client may take to send its request body, else 408")
    timeout_keep_alive: float = arg(30.0, "seconds an idle HTTP connection stays open; longer than clients keep "
                                          "idle connections (httpx 5 s, aiohttp 15 s), so a client never sends on "
                                          "one the server is closing")
    max_logprob_entries: int = arg(1 << 18, "logprob entries (token + alternatives, prompt and output, all choices) "
                                            "one request may produce, else 400")

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        check_choices(self)
        if min(self.watchdog_timeout, self.startup_timeout, self.body_read_timeout, self.timeout_keep_alive) <= 0:
            raise ValueError("watchdog_timeout, startup_timeout, body_read_timeout and timeout_keep_alive must be "
                             "positive")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset for an open server)")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.decode_log_interval < 0:
            raise ValueError(f"decode_log_interval must be >= 0, got {self.decode_log_interval}")
        if self.max_request_body_bytes < 1 or self.max_logprob_entries < 0:
            raise ValueError("max_request_body_bytes must be >= 1 and max_logprob_entries >= 0")
