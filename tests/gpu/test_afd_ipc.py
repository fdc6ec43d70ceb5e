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

import queue
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.ipc_transport import IpcTransport
from minisgl.afd.worker_group import WorkerFailure
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.layers.fp8 import dequantize_block_fp8, quantize_block_fp8
from minisgl.scheduler.messages import GenerateRequest

pytestmark = pytest.mark.gpu

H, K, E = 256, 2, 8
BUCKETS, LAYERS, NUM_MB = (1, 8, 64), 3, 2
REPLAYS = 3
EXCHANGE_TIMEOUT_S = 3.0  # a device wait's deadline in the pair test (each side waits at barriers, not on a peer's host)
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


def _message(bucket: int, layer: int, mb: int, salt: int, dtype: torch.dtype):
    """A dispatch's tokens (some messages leave padding rows), rows of very different scales, never zeros."""
    g = torch.Generator().manual_seed(((salt * 131 + bucket) * 17 + layer) * 7 + mb)
    t = max(1, bucket - (layer + mb) % 3)
    x = torch.randn(t, H, generator=g) * torch.logspace(-2, 1, t)[:, None]
    ids = torch.randint(0, E, (t, K), generator=g, dtype=torch.int32)
    w = torch.rand(t, K, generator=g) + 0.1
    return x.to(dtype).cuda(), ids.cuda(), w.cuda()


def _on_the_wire(x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """What the expert worker receives for x: itself, or its FP8 round trip."""
    if not fp8:
        return x
    q, s = quantize_block_fp8(x.float(), (1, 128))
    return dequantize_block_fp8(q, s, (1, 128), x.dtype)


def _expert(hidden: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The expert worker's stand-in computation: elementwise, so any row count gives the same bits."""
    return hidden * w[:, :1].to(hidden.dtype) + ids[:, 1:].to(hidden.dtype)


def _check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else "shape"
        raise AssertionError(f"{what}: got {tuple(got.shape)} differs from {tuple(want.shape)} (max diff {diff})")


def _ag_round(tr: IpcTransport, inputs: dict, bucket: int, layer: int) -> dict:
    pending = [tr.dispatch(mb, bucket, *inputs[bucket, layer, mb]) for mb in range(NUM_MB)]
    return {(bucket, layer, mb): tr.combine(p) for mb, p in enumerate(pending)}


def _ag_check(outs: dict, salt: int, dtype: torch.dtype, fp8: bool) -> None:
    for (bucket, layer, mb), got in outs.items():
        x, ids, w = _message(bucket, layer, mb, salt, dtype)
        _check(f"combine bucket {bucket} layer {layer} mb {mb} salt {salt}", got, _expert(_on_the_wire(x, fp8), ids, w))


def _eg_round(tr: IpcTransport, bucket: int, layer: int) -> dict:
    seen = {}
    for mb in range(NUM_MB):
        hidden, ids, w = tr.receive(tr.post_receive(mb, bucket))
        seen[bucket, layer, mb] = (hidden, ids, w)
        tr.send_combine(mb, bucket, _expert(hidden, ids, w))
    return seen


def _eg_check(seen: dict, salt: int, dtype: torch.dtype, fp8: bool) -> None:
    for (bucket, layer, mb), (hidden, ids, w) in seen.items():
        x, want_ids, want_w = _message(bucket, layer, mb, salt, dtype)
        t, name = x.shape[0], f"dispatch bucket {bucket} layer {layer} mb {mb} salt {salt}"
        _check(name + " hidden", hidden[:t], _on_the_wire(x, fp8))
        _check(name + " padding hidden", hidden[t:], torch.zeros_like(hidden[t:]))
        _check(name + " ids", ids[:t], want_ids.long())
        _check(name + " padding ids", ids[t:], torch.full_like(ids[t:], -1))
        _check(name + " weights", w[:t], want_w)
        _check(name + " padding weights", w[t:], torch.zeros_like(w[t:]))


def _pair(rank: int, port: int, dtype: torch.dtype, fp8: bool, results) -> None:
    try:
        torch.cuda.set_device(0)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
        tr = IpcTransport(rank, 1, 1, H, K, dtype, fp8, torch.device("cuda:0"), num_mb=NUM_MB,
                          max_bucket=max(BUCKETS), timeout_s=EXCHANGE_TIMEOUT_S)
        _compile_flag_kernels()
        dist.barrier()  # no wait below spans a peer's compile
        rounds = [(b, layer) for b in BUCKETS for layer in range(LAYERS)]
        if rank == 0:
            _attention_side(tr, rounds, dtype, fp8, results)
        else:
            _expert_side(tr, rounds, dtype, fp8)
        dist.barrier()
        results.put((rank, "ok", None))
    except BaseException:  # noqa: BLE001 - the parent reports it
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _compile_flag_kernels() -> None:
    """Compile both kernels on a private flag, specialised as the transport's calls are."""
    from minisgl.kernels import device_flags

    flag, count, error = (torch.zeros(device_flags.FLAG_SLOT, dtype=torch.int32, device="cuda") for _ in range(3))
    device_flags.signal(flag[:1])
    device_flags.wait(flag[:1], count[:1], error[:1], 0, int(5e9))
    torch.cuda.synchronize()


def _attention_side(tr: IpcTransport, rounds: list, dtype: torch.dtype, fp8: bool, results) -> None:
    keys = [(b, layer, mb) for b, layer in rounds for mb in range(NUM_MB)]
    eager = {k: _message(*k, 0, dtype) for k in keys}
    outs: dict = {}
    for b, layer in rounds:
        outs |= _ag_round(tr, eager, b, layer)
    _ag_check(outs, 0, dtype, fp8)
    tr.check()
    # One graph holding every round; fresh inputs go into its static ones before each replay.
    static = {k: tuple(t.clone() for t in eager[k]) for k in keys}
    graph, outs = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        for b, layer in rounds:
            outs |= _ag_round(tr, static, b, layer)
    dist.barrier()  # both captured
    for salt in range(1, REPLAYS + 1):
        for k in keys:
            for dst, src in zip(static[k], _message(*k, salt, dtype)):
                dst.copy_(src)
        torch.cuda.synchronize()
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        _ag_check(outs, salt, dtype, fp8)
        tr.check()
    results.put((0, "replays", REPLAYS))
    # A combine that never comes (the expert side waits at the barrier): the device wait gives up
    # after its deadline, check() names the channel, and the next wait costs no second deadline.
    start = time.monotonic()
    tr.combine(tr.dispatch(0, 1, *_message(1, 0, 0, 99, dtype)))
    torch.cuda.synchronize()
    took = time.monotonic() - start
    try:
        tr.check()
        raise AssertionError("check() raised nothing after a combine that never came")
    except RuntimeError as e:
        message = str(e)
    assert "the combine of expert worker 0 (rank 1) for micro-batch 0 did not arrive" in message, message
    assert EXCHANGE_TIMEOUT_S * 0.8 < took < EXCHANGE_TIMEOUT_S + 5, took
    start = time.monotonic()
    tr.combine(tr.dispatch(1, 1, *_message(1, 0, 1, 99, dtype)))
    torch.cuda.synchronize()
    assert time.monotonic() - start < 1.0, "a second wait after a timeout spun again"
    results.put((0, "timeout", round(took, 2)))


def _expert_side(tr: IpcTransport, rounds: list, dtype: torch.dtype, fp8: bool) -> None:
    seen: dict = {}
    for b, layer in rounds:
        seen |= _eg_round(tr, b, layer)
    _eg_check(seen, 0, dtype, fp8)
    tr.check()
    graph, seen = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        for b, layer in rounds:
            seen |= _eg_round(tr, b, layer)
    dist.barrier()
    for salt in range(1, REPLAYS + 1):
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        _eg_check(seen, salt, dtype, fp8)
        tr.check()


@pytest.mark.parametrize("dtype,fp8", [(torch.float32, False), (torch.bfloat16, True)], ids=["fp32", "bf16-fp8"])
def test_two_processes_exchange_eagerly_and_in_graphs(dtype: torch.dtype, fp8: bool) -> None:
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = ctx.Queue()
    procs = [ctx.Process(target=_pair, args=(r, store.port, dtype, fp8, results), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + PAIR_JOIN_S
    ended: dict[int, str] = {}
    notes: list = []
    errors: list[str] = []
    while len(ended) < 2 and (left := deadline - time.monotonic()) > 0:
        try:
            rank, kind, payload = results.get(timeout=min(left, 1.0))
        except queue.Empty:
            dead = [f"rank {r} exited with {p.exitcode}" for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                    and r not in ended]
            if dead:
                errors += dead
                break
            continue
        if kind in ("ok", "error"):
            ended[rank] = kind
            if kind == "error":
                errors.append(f"rank {rank}:\n{payload}")
        else:
            notes.append((rank, kind, payload))
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(5)
    if len(ended) < 2 and not errors:
        errors.append(f"ranks {sorted(set(range(2)) - set(ended))} did not finish within {PAIR_JOIN_S:.0f} s")
    assert not errors, "\n".join(errors)
    assert set(ended.values()) == {"ok"}, ended
    assert (0, "replays", REPLAYS) in notes, notes
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
        coord.workers.launcher.procs["expert0"].kill()
        start = time.monotonic()
        with pytest.raises(WorkerFailure) as failure:
            while coord.has_work and time.monotonic() - start < 10:
                coord.step()
        took = time.monotonic() - start
        assert took < 10, took
        message = str(failure.value)
        assert "worker expert0 (pid " in message and "killed by signal 9" in message, message
        assert not coord.has_work, "every request ended with the failure"
        coord.check_integrity()  # every page and slot is back
        print(f"\nexpert0 killed mid-decode: failure after {took:.2f} s: {message}")
    finally:
        coord.close()
