"""Schemathesis over the live server's /openapi.json, valid and invalid bodies for every route:
no 5xx. Bounded: MAX_EXAMPLES per route and mode, and generated sizes are clamped so a valid
request stays cheap on the CPU (clamping only lowers large values: an invalid body stays invalid).

Driven through schemathesis' strategies rather than its pytest plugin, whose lazy fixture
loading does not work with pytest 9."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from server_harness import Server

MAX_EXAMPLES = 20
_CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2}


def _clamp(case: schemathesis.Case) -> None:
    if isinstance(case.body, dict):
        for key, cap in _CAPS.items():
            v = case.body.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > cap:
                case.body[key] = cap


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(live_server: Server, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(live_server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/health"}
    for op in operations:
        if mode is GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # a GET without parameters has no invalid form

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            _clamp(case)
            r = case.call(base_url=live_server.url, timeout=30)
            assert r.status_code < 500, f"{case.method} {case.path} {case.body!r} -> {r.status_code} {r.text}"

        check()


def test_still_healthy_and_clean(live_server: Server) -> None:
    stats = live_server.wait_idle()
    assert (stats["used_pages"], stats["used_slots"]) == (0, 0)
    assert live_server.get("/health").status_code == 200
