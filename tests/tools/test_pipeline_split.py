"""Micro-batch splits (--afd-mb-split), the workload -> spec path, and the simulator's CLI."""
from __future__ import annotations

import json

import pytest

from minisgl.afd.mb_split import split
from minisgl.models.config import parse_config
from minisgl.models.known_configs import hf_config
from minisgl.tools.pipeline import cli as pipeline
from minisgl.tools.pipeline.costs import Roofline
from minisgl.tools.pipeline.sim import FULL, GDN, simulate
from minisgl.tools.pipeline.table import LayerTable, interp
from minisgl.tools.pipeline.workload import Workload, build_spec, kinds_of, spread_contexts


def test_count_split_is_contiguous_and_even() -> None:
    assert split(list("abcde"), [1] * 5, 2, "count") == [list("abc"), list("de")]
    assert split(list("ab"), [1, 1], 3, "count") == [["a"], ["b"], []]


def test_context_split_keeps_sizes_balances_context_and_order() -> None:
    ctx = [3000, 2800, 2500, 900, 700, 300, 200, 100]  # oldest (longest) first, as the running list is
    count = split(ctx, ctx, 2, "count")
    balanced = split(ctx, ctx, 2, "context")
    assert [len(mb) for mb in balanced] == [len(mb) for mb in count]
    assert sorted(c for mb in balanced for c in mb) == sorted(ctx)
    assert all(mb == sorted(mb, key=ctx.index) for mb in balanced)  # original order within a micro-batch
    spread = lambda mbs: max(map(sum, mbs)) - min(map(sum, mbs))  # noqa: E731
    assert spread(count) == 7900 and spread(balanced) == 700  # the best split of these sizes
    with pytest.raises(ValueError, match="one of"):
        split(ctx, ctx, 2, "tokens")


def test_roofline_spec_reflects_the_layer_imbalance() -> None:
    config = parse_config(hf_config("Qwen3.5-122B-A10B"))
    costs = Roofline(config)
    # GDN moves a fixed 4 MiB state per request; full attention 2 KiB per token: they cross near 4K.
    assert costs.attn(FULL, 64, 64 * 2048) < costs.attn(GDN, 64, 64 * 2048)
    assert costs.attn(FULL, 64, 64 * 8192) > costs.attn(GDN, 64, 64 * 8192)
    long = Workload(spread_contexts(64, 32768, None), 2, 4, 4)
    r = simulate(build_spec(kinds_of(config.layer_types), long, costs))
    assert r.eg_idle[FULL] > r.eg_idle.get(GDN, 0.0)  # at 32K the experts wait on the full layers


def test_measured_table_interpolates(tmp_path) -> None:
    assert interp([1, 3], [10, 30], 2) == 20 and interp([1, 3], [10, 30], 5) == 50 and interp([1, 3], [10, 30], -9) == 0
    table = {"expert_workers": 4, "attn": {"gdn": [[8, 1024, 100], [16, 1024, 200]],
                                           "full": [[8, 1024, 50], [8, 4096, 150], [16, 1024, 90], [16, 4096, 290]]},
             "shared": [[8, 5], [16, 6]], "head": [[8, 1]], "tail": [[8, 40], [16, 50]], "expert": [[32, 300], [64, 320]]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    t = LayerTable.load(str(path), Roofline(parse_config(hf_config("Qwen3.5-122B-A10B"))))
    assert t.attn(FULL, 16, 16 * 4096) == 290 and t.attn(FULL, 12, 12 * 2560) == pytest.approx(145)
    assert t.expert(48, 4) == 310
    with pytest.raises(ValueError, match="expert-workers 8"):
        t.expert(48, 8)


def test_cli_prints_the_step_and_bubbles(capsys) -> None:
    pipeline.main(["--model", "qwen35-122b", "--context", "8192", "--batch", "64", "--num-mb", "2", "--ratio", "4:4"])
    out = capsys.readouterr().out
    assert "step " in out and "AG idle" in out and "MegaScale-Infer closed form" in out and "tokens/s per GPU" in out
    with pytest.raises(SystemExit, match="M:N"):
        pipeline.main(["--ratio", "4-4"])
