"""The Ray launcher on a local Ray cluster: workers placed as actors on the named node give the
colocated engine's tokens."""
from __future__ import annotations

import pytest

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs

ray = pytest.importorskip("ray", reason="Ray is the optional [ray] extra; `make test` installs it")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray.util.get_node_ip_address()
    ray.shutdown()


def test_ray_launcher_matches_colocated(tiny_checkpoints, local_ray) -> None:
    engine = dict(dtype="float32", device="cpu", context_length=128, chunked_prefill_size=4)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [r.token_ids for r in LLM(tiny_checkpoints["bf16"], **engine).generate(prompts, params)]
    afd = AfdArgs(attn_workers=2, expert_workers=1, num_mb=2, launcher="ray", attn_nodes=local_ray, expert_nodes=local_ray)
    with LLM(tiny_checkpoints["bf16"], afd=afd, **engine) as llm:
        assert [r.token_ids for r in llm.generate(prompts, params)] == want
