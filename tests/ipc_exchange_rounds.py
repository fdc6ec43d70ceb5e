"""Rounds of AFD dispatch and combine through an IpcTransport, for the CPU test (host shared
memory, tests/afd/test_afd_ipc_transport.py) and the GPU test (CUDA IPC, tests/gpu/test_afd_ipc.py).

Each message is random, from a seed both sides know (never zeros; rows of very different scales;
some messages leave padding rows); expert worker e stands in for its experts with an elementwise
function of what it received and e, so every row count gives the same bits; every side checks
everything it received against a torch reference. A round is one layer: every micro-batch
dispatched, then every micro-batch combined, as the attention worker's ping-pong issues them."""
from __future__ import annotations

import queue
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minisgl.layers.fp8 import dequantize_block_fp8, quantize_block_fp8

H, K, E = 256, 2, 8


def message(bucket: int, layer: int, mb: int, ag: int, salt: int, dtype: torch.dtype, device: str):
    """(x [t, H], ids [t, K] int32, weights [t, K]) that attention lane `ag` dispatches."""
    g = torch.Generator().manual_seed((((salt * 131 + bucket) * 17 + layer) * 7 + mb) * 5 + ag)
    t = max(1, bucket - (layer + mb + ag) % 3)
    x = torch.randn(t, H, generator=g) * torch.logspace(-2, 1, t)[:, None]
    ids = torch.randint(0, E, (t, K), generator=g, dtype=torch.int32)
    w = torch.rand(t, K, generator=g) + 0.1
    return x.to(dtype).to(device), ids.to(device), w.to(device)


def on_the_wire(x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """What an expert worker receives for x: x itself, or its FP8 round trip."""
    if not fp8:
        return x
    q, s = quantize_block_fp8(x.float(), (1, 128))
    return dequantize_block_fp8(q, s, (1, 128), x.dtype)


def expert(hidden: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, e: int) -> torch.Tensor:
    """Expert worker e's stand-in: elementwise, distinct per worker."""
    return hidden * w[:, :1].to(hidden.dtype) + ids[:, 1:].to(hidden.dtype) + e


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.shape != want.shape or not torch.equal(got, want):
        diff = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else "n/a"
        raise AssertionError(f"{what}: got {tuple(got.shape)}, want {tuple(want.shape)}, max diff {diff}")


def attention_round(tr, inputs: dict, bucket: int, layer: int, num_mb: int) -> dict:
    pending = [tr.dispatch(mb, bucket, *inputs[bucket, layer, mb]) for mb in range(num_mb)]
    return {(bucket, layer, mb): tr.combine(p) for mb, p in enumerate(pending)}


def attention_check(outs: dict, ag: int, salt: int, num_eg: int, dtype: torch.dtype, fp8: bool, device: str) -> None:
    for (bucket, layer, mb), got in outs.items():
        x, ids, w = message(bucket, layer, mb, ag, salt, dtype, device)
        want = torch.stack([expert(on_the_wire(x, fp8), ids, w, e) for e in range(num_eg)]).sum(dim=0)
        check(f"lane {ag} combine, bucket {bucket} layer {layer} mb {mb} salt {salt}", got, want)


def expert_round(tr, bucket: int, layer: int, num_mb: int, e: int) -> dict:
    seen = {}
    for mb in range(num_mb):
        hidden, ids, w = tr.receive(tr.post_receive(mb, bucket))
        seen[bucket, layer, mb] = (hidden, ids, w)
        tr.send_combine(mb, bucket, expert(hidden, ids, w, e))
    return seen


def expert_check(seen: dict, e: int, salt: int, num_ag: int, dtype: torch.dtype, fp8: bool, device: str) -> None:
    for (bucket, layer, mb), (hidden, ids, w) in seen.items():
        for ag in range(num_ag):
            x, want_ids, want_w = message(bucket, layer, mb, ag, salt, dtype, device)
            rows, t = slice(ag * bucket, (ag + 1) * bucket), x.shape[0]
            h, i, wt = hidden[rows], ids[rows], w[rows]
            name = f"expert {e} dispatch from lane {ag}, bucket {bucket} layer {layer} mb {mb} salt {salt}"
            check(name + ": hidden", h[:t], on_the_wire(x, fp8))
            check(name + ": ids", i[:t], want_ids.long())
            check(name + ": weights", wt[:t], want_w)
            check(name + ": padding hidden", h[t:], torch.zeros_like(h[t:]))
            check(name + ": padding ids", i[t:], torch.full_like(i[t:], -1))
            check(name + ": padding weights", wt[t:], torch.zeros_like(wt[t:]))


def rank_main(body, rank: int, port: int, world: int, results, *args) -> None:
    """A spawned rank: joins a gloo world through the parent's store, runs body(rank, results, *args),
    and reports (rank, "ok", None) or (rank, "error", its traceback)."""
    try:
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
        body(rank, results, *args)
        dist.barrier()
        results.put((rank, "ok", None))
    except BaseException:  # noqa: BLE001 - the parent reports it
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(body, args: tuple, world: int, timeout_s: float) -> list:
    """Runs body on `world` spawned ranks (rank_main); returns the (rank, kind, value) notes they put
    on the way. Fails with every rank's traceback, a rank's death, or the ranks still running at
    the timeout (which are killed): nothing hangs."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(body, r, store.port, world, results, *args), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    ended: dict[int, str] = {}
    notes, errors = [], []
    try:
        while len(ended) < world and (left := deadline - time.monotonic()) > 0:
            try:
                rank, kind, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if died := [f"rank {r} exited with code {p.exitcode} without a report" for r, p in enumerate(procs)
                            if p.exitcode is not None and r not in ended]:
                    errors += died
                    break
                continue
            if kind == "error":  # its peers may be stuck waiting for it: a moment for their own reports
                errors.append(f"rank {rank}:\n{value}")
                deadline = min(deadline, time.monotonic() + 3.0)
            if kind in ("ok", "error"):
                ended[rank] = kind
            else:
                notes.append((rank, kind, value))
    finally:
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
    if len(ended) < world and not errors:
        errors.append(f"ranks {sorted(set(range(world)) - set(ended))} did not finish within {timeout_s:.0f} s")
    assert not errors, "\n".join(errors)
    return notes
