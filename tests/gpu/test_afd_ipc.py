"""The AFD ipc transport on one GPU (every process on cuda:0):

- the device flag kernels: a raised flag is taken, an unraised one times out into the error word
  within its deadline instead of hanging, and later waits return at once;
- two processes exchange random dispatch and combine messages through IpcTransport for several
  layers x 2 micro-batches x 3 buckets, eagerly, then captured in one CUDA graph per process and
  replayed 3 times with fresh inputs, each side checking every message against a torch reference
  built from the same seeds; then a combine that never comes times out on the device and check()
  names the peer;
- AFD 1+1 on one GPU (--afd-gpus 1, --afd-transport ipc), num_mb 1 and 2: greedy tokens identical
  to the colocated engine on the same GPU over mixed-length prompts finishing at different steps;
- the expert worker killed mid-decode: every in-flight request ends with the failure within 10 s.

Every process join has a timeout, and a child's failure comes back as its traceback.

    PYTHONPATH=$PWD/python:$PWD/tests python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/gpu/test_afd_ipc.py
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from afd_kill import kill_and_expect_every_request_failed
from ipc_exchange_rounds import (
    attention_check, attention_round, expert_check, expert_round, message, run_ranks, H, K,
)
from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.ipc_transport import IpcTransport
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.scheduler.messages import GenerateRequest

pytestmark = pytest.mark.gpu

BUCKETS, LAYERS, NUM_MB = (1, 8, 64), 3, 2
REPLAYS = 3
EXCHANGE_TIMEOUT_S = 3.0  # a device wait's deadline in the pair test (the sides meet at barriers before waiting)
PAIR_JOIN_S = 120.0


# ---------------------------------------------------------------------------- the flag kernels


def test_flags_take_a_raised_flag_and_time_out_on_a_silent_one() -> None:
    from minisgl.kernels import device_flags

    flag, count, error = (torch.zeros(device_flags.FLAG_SLOT, dtype=torch.int32, device="cuda") for _ in range(3))
    device_flags.signal(flag[:1])
    device_flags.wait(flag[:1], count[:1], error[:1], 5, int(5e9))
    torch.cuda.synchronize()
    assert (int(flag[0]), int(count[0]), int(error[0])) == (1, 1, 0)
    start = time.monotonic()
    device_flags.wait(flag[:1], count[:1], error[:1], 5, int(0.3e9))  # nobody raises it a second time
    torch.cuda.synchronize()
    took = time.monotonic() - start
    assert 0.25 < took < 5, took
    assert int(error[0]) == 6, "the timed-out channel (5) + 1 goes to the error word"
    start = time.monotonic()
    device_flags.wait(flag[:1], count[:1], error[:1], 7, int(5e9))  # the error word is set: no second deadline
    torch.cuda.synchronize()
    assert time.monotonic() - start < 1.0
    assert int(error[0]) == 6, "the first failure is kept"


# ---------------------------------------------------------------------------- two processes, IpcTransport


def _compile_flag_kernels() -> None:
    """Compile both kernels on a private flag, specialised as the transport's calls are, so that no
    wait below spans a peer's compile."""
    from minisgl.kernels import device_flags

    flag, count, error = (torch.zeros(device_flags.FLAG_SLOT, dtype=torch.int32, device="cuda") for _ in range(3))
    device_flags.signal(flag[:1])
    device_flags.wait(flag[:1], count[:1], error[:1], 0, int(5e9))
    torch.cuda.synchronize()


def _pair_rank(rank: int, results, dtype: torch.dtype, fp8: bool) -> None:
    """Rank 0 the attention lane, rank 1 the expert worker, both on cuda:0: the rounds eagerly,
    then captured in one graph and replayed with fresh inputs, every message checked each time."""
    tr = IpcTransport(rank, 1, 1, H, K, dtype, fp8, torch.device("cuda:0"), num_mb=NUM_MB,
                      max_bucket=max(BUCKETS), timeout_s=EXCHANGE_TIMEOUT_S)
    _compile_flag_kernels()
    dist.barrier()
    rounds = [(b, layer) for b in BUCKETS for layer in range(LAYERS)]
    keys = [(b, layer, mb) for b, layer in rounds for mb in range(NUM_MB)]
    ag = rank == 0
    static = {k: message(*k, 0, 0, dtype, "cuda") for k in keys} if ag else {}

    def run() -> dict:
        out: dict = {}
        for b, layer in rounds:
            out |= attention_round(tr, static, b, layer, NUM_MB) if ag else expert_round(tr, b, layer, NUM_MB, 0)
        return out

    def verify(out: dict, salt: int) -> None:
        if ag:
            attention_check(out, 0, salt, 1, dtype, fp8, "cuda")
        else:
            expert_check(out, 0, salt, 1, dtype, fp8, "cuda")
        tr.check()

    verify(run(), 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()  # the graph's static outputs, kept alive here
    dist.barrier()  # both captured
    for salt in range(1, REPLAYS + 1):
        for k in static:  # fresh inputs into the graph's static ones
            for dst, src in zip(static[k], message(*k, 0, salt, dtype, "cuda")):
                dst.copy_(src)
        torch.cuda.synchronize()
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        verify(out, salt)
    results.put((rank, "replays", REPLAYS))
    if ag:
        _combine_that_never_comes(tr, dtype, results)
    # The expert worker waits here (alive, its inbox mapped) while the lane times out.


def _combine_that_never_comes(tr: IpcTransport, dtype: torch.dtype, results) -> None:
    """check() does not wait for the spinning wait (a retiring step must not wait for later steps);
    the device wait gives up at its deadline, check() then names the channel, and the next wait
    costs no second deadline."""
    start = time.monotonic()
    tr.combine(tr.dispatch(0, 1, *message(1, 0, 0, 0, 99, dtype, "cuda")))
    tr.check()  # the wait is still spinning: nothing to report yet, and no waiting for it
    assert time.monotonic() - start < EXCHANGE_TIMEOUT_S * 0.5, "check() waited for the current stream"
    torch.cuda.synchronize()
    took = time.monotonic() - start
    try:
        tr.check()
    except RuntimeError as e:
        message_ = str(e)
    else:
        raise AssertionError("check() raised nothing after a combine that never came")
    assert "the combine of expert worker 0 (rank 1) for micro-batch 0 did not arrive" in message_, message_
    assert EXCHANGE_TIMEOUT_S * 0.8 < took < EXCHANGE_TIMEOUT_S + 5, took
    start = time.monotonic()
    tr.combine(tr.dispatch(1, 1, *message(1, 0, 1, 0, 99, dtype, "cuda")))
    torch.cuda.synchronize()
    assert time.monotonic() - start < 1.0, "a second wait after a timeout spun again"
    results.put((0, "timeout", round(took, 2)))


@pytest.mark.parametrize("dtype,fp8", [(torch.float32, False), (torch.bfloat16, True)], ids=["fp32", "bf16-fp8"])
def test_two_processes_exchange_eagerly_and_in_graphs(dtype: torch.dtype, fp8: bool) -> None:
    notes = run_ranks(_pair_rank, (dtype, fp8), 2, PAIR_JOIN_S)
    assert sorted(r for r, kind, _ in notes if kind == "replays") == [0, 1], notes
    assert [kind for _, kind, _ in notes].count("timeout") == 1, notes
    print(f"\nipc pair {dtype} fp8={fp8}: {notes}")


# ---------------------------------------------------------------------------- AFD 1+1 on one GPU

PROMPT_LENS = [1, 7, 23, 64, 97, 40]
MAX_TOKENS = [5, 32, 17, 24, 9, 32]
ENGINE = dict(device="cuda", dtype="float32", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4, num_pages=96, disable_cuda_graph=True, attention_backend="triton",
              gdn_backend="triton", moe_backend="triton")
ONE_GPU = dict(attn_workers=1, expert_workers=1, gpus=1, transport="ipc")


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(99)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def colocated(tiny_checkpoints):
    """The colocated engine's greedy tokens on this GPU, eager as the AFD workers run."""
    with LLM(tiny_checkpoints["bf16"], **ENGINE) as llm:
        prompts = _prompts(llm.engine.config.vocab_size)
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
        out = llm.generate(prompts, params)
    return prompts, params, [(r.token_ids, r.finish_reason) for r in out]


@pytest.mark.parametrize("num_mb", [1, 2])
def test_afd_on_one_gpu_matches_colocated(tiny_checkpoints, colocated, num_mb: int) -> None:
    prompts, params, want = colocated
    afd = AfdArgs(**ONE_GPU, num_mb=num_mb, async_pending_steps=2, step_timeout_s=120)
    with LLM(tiny_checkpoints["bf16"], afd=afd, **ENGINE) as llm:
        assert llm.scheduler.workers.devices == ["cuda:0", "cuda:0"]
        out = llm.generate(prompts, params)
        stats = llm.scheduler.stats()
    got = [(r.token_ids, r.finish_reason) for r in out]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"prompt {i} (length {PROMPT_LENS[i]}): AFD {g} != colocated {w}"
    assert stats.used_slots == 0 and stats.used_pages == 0 and stats.num_running == 0


def test_killed_expert_worker_fails_in_flight_requests(tiny_checkpoints) -> None:
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], **ENGINE))
    coord = Coordinator(plan, AfdArgs(**ONE_GPU, num_mb=2, step_timeout_s=60, warmup="off"))
    try:
        params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        for i in range(4):
            coord.add_request(GenerateRequest(f"r{i}", (1, 2, 3, 4 + i), params))
        for _ in range(6):  # prefill and some decode steps
            coord.step()
        print("\nmid-decode: " + kill_and_expect_every_request_failed(coord, "expert0"))
    finally:
        coord.close()
