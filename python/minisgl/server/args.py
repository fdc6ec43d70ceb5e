"""Server flags that are not engine or scheduler flags (SGLang's names where SGLang has one)."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.server.reasoning import REASONING_PARSERS
from minisgl.server.tool_parser import TOOL_PARSERS


@dataclass(frozen=True)
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str | None = None  # None = the model path (or "minisgl-tiny" for the embedded model)
    watchdog_timeout: float = 300.0  # seconds one step may take before the engine counts as hung
    startup_timeout: float = 1800.0  # seconds to wait for the engine to load the model
    log_level: str = "info"
    reasoning_parser: str | None = None  # "qwen3": <think> blocks -> reasoning_content
    tool_call_parser: str | None = None  # "qwen3_coder": Qwen3.5 XML tool calls -> tool_calls
    generation_config: str = "auto"  # sampling defaults: "auto" (the model's), "ignore", or a folder
    api_key: str | None = None  # Bearer key for /v1/* and the admin routes; None = open
    max_queued_requests: int | None = 1024  # choices that may wait beyond the engine's running slots; None = no limit
    max_request_body_bytes: int = 16 << 20
    body_read_timeout: float = 30.0  # seconds a client may take to send its whole request body
    max_logprob_entries: int = 1 << 18  # logprob entries (token + alternatives) one request may produce

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for flag, value, names in (("--reasoning-parser", self.reasoning_parser, REASONING_PARSERS),
                                   ("--tool-call-parser", self.tool_call_parser, TOOL_PARSERS)):
            if value is not None and value not in names:
                raise ValueError(f"{flag} {value!r} is not one of {', '.join(names)}")
        if self.watchdog_timeout <= 0 or self.startup_timeout <= 0 or self.body_read_timeout <= 0:
            raise ValueError("watchdog_timeout, startup_timeout and body_read_timeout must be positive")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset for an open server)")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.max_request_body_bytes < 1 or self.max_logprob_entries < 0:
            raise ValueError("max_request_body_bytes must be >= 1 and max_logprob_entries >= 0")
