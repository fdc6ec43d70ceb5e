"""How can two processes on ONE GPU exchange AFD messages inside CUDA graphs, and what does a round
trip cost? (issue 21: every AFD worker a process of its own on one H200, both roles decoding under
graphs with the per-layer dispatch and combine inside them.)

    python3 benchmarks/afd_ipc_probe.py --out /tmp/afd_ipc.json [--rows 64 512] [--hidden 3072] [--iters 1000]

Process A owns the buffers (to_b, to_a, flags) and shares them with process B through
torch.multiprocessing; a round trip is A writing rows x hidden bf16 into to_b, B copying to_b into
to_a, and A seeing to_a complete. The options:

- local_copy: the same two copies in one process (captured, no peer): the floor.
- host_sync: each side synchronises its stream and tells the other through a pipe.
- ipc_event_eager: interprocess CUDA events recorded by one side and waited on by the other's stream;
  the pipe only says that the record was issued.
- event_graph_*: the same with the record and the wait captured in CUDA graphs, as torch issues them
  (plain; external=True) and through the driver with the EXTERNAL record/wait flags. Each reports
  its capture error or success, and whether a replay honours the dependency: B's wait is issued
  while A's record sits behind a ~50 ms sleep on A's stream, so a wait that is not honoured copies a
  stale buffer.
- flag_eager / flag_graph: device-side flags, a Triton kernel raising a counter with a release
  store and one spinning on a volatile load, the graph variant with `--chunk` round trips captured
  in one graph per side. These are the library's kernels (minisgl/kernels/device_flags.py, which
  the ipc transport uses). Every spin gives up after --wait-timeout-ms and counts a timeout, so a
  time-sliced GPU that starves the writer shows up as timeouts, never a hang.
- flag_graph_one_process: the same graphs on two streams of one process, where both spinning
  kernels run at once instead of time-slicing: what the flags cost when nothing is time-sliced.

Flag and local_copy latencies are device-side: the waiting kernel stamps %globaltimer when it
returns, and a round trip is the time between consecutive stamps within one chunk. Host-mediated
latencies are host wall time per serialised round trip. Every option runs in fresh spawned
processes under a hard timeout (a hung one is killed and reported), and the whole probe stays
within --budget-s. Timings are printed as a table and written as JSON to --out.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import queue
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
import torch.multiprocessing as mp

try:
    import triton
    import triton.language as tl

    from minisgl.kernels import device_flags
except ImportError:  # reported per option; the host-mediated options do not need it
    triton = device_flags = None

NO_CUDA = (
    "afd_ipc_probe: no CUDA device is visible (torch.cuda.is_available() is False). The probe measures "
    "CUDA IPC between processes sharing one GPU; run it on a GPU machine."
)


@dataclass(frozen=True)
class Config:
    rows: tuple[int, ...]
    hidden: int
    iters: int  # measured round trips per message size
    warmup: int
    chunk: int  # round trips per synchronised chunk (per captured graph in the graph variants)
    wait_timeout_ns: int  # how long a device-side wait spins before it gives up and counts a timeout
    sleep_cycles: int  # the delay that exposes a dependency a replay does not honour
    size_budget_s: float  # a size's measurement stops early (flagged) past this


# ---------------------------------------------------------------------------- device-side flags

if triton is not None:

    @triton.jit
    def _stamp_kernel(count_ptr, stamp_ptr, capacity):
        idx = tl.load(count_ptr)
        tl.store(count_ptr, idx + 1)
        if idx < capacity:
            tl.store(stamp_ptr + idx, device_flags.globaltimer())


class FlagEnd:
    """One side of a pair of flags (a (2, FLAG_SLOT) int32 tensor): it raises flag `send` and waits
    on flag `recv`. Both counts live on the device, so the calls can be captured and replayed; each
    wait stamps the time it returned."""

    def __init__(self, flags: torch.Tensor, send: int, recv: int, capacity: int, timeout_ns: int) -> None:
        if triton is None:
            raise RuntimeError("the flag options need triton (pip install triton) and minisgl on PYTHONPATH")
        dev = flags.device
        self.send_flag, self.recv_flag = flags[send, :1], flags[recv, :1]
        self.received, self.timeouts = (torch.zeros(device_flags.FLAG_SLOT, dtype=torch.int32, device=dev)
                                        for _ in range(2))
        self.clock = Clock(capacity)
        self.timeout_ns = timeout_ns

    def signal(self) -> None:
        device_flags.signal(self.send_flag)

    def wait(self) -> None:
        # A wait that times out sets the error word, and every later one returns at once: the
        # probe reports whether any timed out.
        device_flags.wait(self.recv_flag, self.received[:1], self.timeouts[:1], 0, self.timeout_ns)
        self.clock.stamp()

    @property
    def stamps(self) -> torch.Tensor:
        return self.clock.stamps

    def stats(self) -> dict[str, int]:
        return {"timed_out": int(self.timeouts[0].item() != 0)}


class Clock:
    """Stamps %globaltimer from a kernel of its own: the same clock the flag waits use, for the
    same-process baseline."""

    def __init__(self, capacity: int) -> None:
        if triton is None:
            raise RuntimeError("local_copy needs triton (pip install triton)")
        self.count = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.stamps = torch.zeros(capacity, dtype=torch.int64, device="cuda")

    def stamp(self) -> None:
        _stamp_kernel[(1,)](self.count, self.stamps, self.stamps.numel(), num_warps=1)


# ---------------------------------------------------------------------------- pure helpers


def chunk_intervals_us(stamps_ns: list[int], warmup: int, chunk: int, chunks: int) -> list[float]:
    """Round-trip times from one stamp per round trip: the gaps between consecutive stamps inside
    each measured chunk. The gap across a chunk boundary holds the host's synchronisation, so it is
    not a round trip and is left out."""
    out: list[float] = []
    for c in range(chunks):
        s = stamps_ns[warmup + c * chunk : warmup + (c + 1) * chunk]
        out += [(b - a) / 1e3 for a, b in zip(s, s[1:])]
    return out


def summary(samples_us: list[float]) -> dict[str, float | int]:
    """Median, nearest-rank P99 and max."""
    if not samples_us:
        return {"n": 0}
    s = sorted(samples_us)
    return {"n": len(s), "median_us": statistics.median(s), "p99_us": s[max(0, math.ceil(0.99 * len(s)) - 1)],
            "max_us": s[-1]}


# ---------------------------------------------------------------------------- shared pieces


def _buffers(cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A's buffers, shared with B: to_b (A writes), to_a (B writes), one pair of flags per size."""
    shape = (max(cfg.rows), cfg.hidden)
    to_b = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    to_a = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    slot = device_flags.FLAG_SLOT if device_flags else 1  # the host-mediated options never touch the flags
    flags = torch.zeros(len(cfg.rows), 2, slot, dtype=torch.int32, device="cuda")
    return to_b, to_a, flags


def _message(cfg: Config, rows: int) -> torch.Tensor:
    return torch.randn(rows, cfg.hidden, dtype=torch.bfloat16, device="cuda")


def _row(cfg: Config, rows: int, samples: list[float], clock: str, **extra: object) -> dict[str, object]:
    """One size's result; clock is 'device' (stamps in kernels) or 'host' (wall time per round trip)."""
    row: dict[str, object] = {"rows": rows, "msg_kib": rows * cfg.hidden * 2 // 1024, "clock": clock,
                              **summary(samples)}
    if len(samples) < cfg.iters - cfg.iters // cfg.chunk:
        row["note"] = "stopped early (size budget)"
    return row | extra


def _serve(conn, handlers: dict[str, Callable[[object], object]]) -> None:
    """B's loop: (kind, arg) requests answered with handlers[kind](arg) until None."""
    while (msg := conn.recv()) is not None:
        kind, arg = msg
        conn.send(handlers[kind](arg))


def _host_paced(cfg: Config, conn, rows: int, hand_off: Callable[[], None],
                await_reply: Callable[[], None]) -> list[float]:
    """A's side of serialised round trips through the pipe: host wall time of each, in us."""
    samples: list[float] = []
    end = time.monotonic() + cfg.size_budget_s
    for i in range(cfg.warmup + cfg.iters):
        t0 = time.perf_counter()
        hand_off()
        conn.send(("rt", rows))
        conn.recv()
        await_reply()
        if i >= cfg.warmup:
            samples.append((time.perf_counter() - t0) * 1e6)
        if time.monotonic() > end:
            break
    return samples


def _sync() -> None:
    torch.cuda.current_stream().synchronize()


def _capture(fn: Callable[[], None], stream: torch.cuda.Stream | None = None) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return graph


def _describe(e: BaseException) -> str:
    """The error and the one it was raised while handling: a failed call inside a capture often
    surfaces as the capture's end failing."""
    text = f"{type(e).__name__}: {e}".strip()
    return text if e.__context__ is None else f"{text} <- {_describe(e.__context__)}"


def _try_capture(fn: Callable[[], None]) -> tuple[torch.cuda.CUDAGraph | None, str]:
    """The graph, or None and the exact error the capture raised."""
    try:
        return _capture(fn), "ok"
    except Exception as e:  # noqa: BLE001 - the error text is the measurement
        error = _describe(e)
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        error += f" (then synchronize: {_describe(e)})"
    return None, error


# ---------------------------------------------------------------------------- options


def local_copy(cfg: Config, conn, emit) -> None:
    """Floor: the round trip's two copies in one process, captured `chunk` at a time."""
    to_b, to_a, _ = _buffers(cfg)
    for rows in cfg.rows:
        msg, clock = _message(cfg, rows), Clock(cfg.warmup + cfg.iters)

        def step() -> None:
            to_b[:rows].copy_(msg)
            to_a[:rows].copy_(to_b[:rows])
            clock.stamp()

        for _ in range(cfg.warmup):
            step()
        graph = _capture(lambda: [step() for _ in range(cfg.chunk)])
        chunks = _run_chunks(cfg, graph.replay, conn=None)
        samples = chunk_intervals_us(clock.stamps.tolist(), cfg.warmup, cfg.chunk, chunks)
        emit(_row(cfg, rows, samples, "device", data_ok=bool(torch.equal(to_a[:rows], msg))))


def _run_chunks(cfg: Config, run_chunk: Callable[[], None], conn) -> int:
    """A's measured chunks, each synchronised (and, with a peer, acknowledged by it); returns how
    many ran before the size budget ran out."""
    end, done = time.monotonic() + cfg.size_budget_s, 0
    while done < cfg.iters // cfg.chunk and time.monotonic() < end:
        if conn is not None:
            conn.send(("chunk", None))
        run_chunk()
        torch.cuda.synchronize()
        if conn is not None:
            conn.recv()
        done += 1
    return done


def _chunk_runner(cfg: Config, steps: list[tuple[torch.cuda.Stream, Callable[[], None]]],
                  use_graph: bool) -> Callable[[], None]:
    """One chunk of each (stream, step): interleaved eager launches, or one graph per stream."""
    if not use_graph:
        def eager() -> None:
            for _ in range(cfg.chunk):
                for stream, step in steps:
                    with torch.cuda.stream(stream):
                        step()
        return eager
    graphs = [(s, _capture(lambda step=step: [step() for _ in range(cfg.chunk)], stream=s)) for s, step in steps]

    def replay() -> None:
        for stream, graph in graphs:
            with torch.cuda.stream(stream):
                graph.replay()
    return replay


def _compile_flag_kernels(cfg: Config) -> None:
    """Compiles both kernels on a private flag (raised, then awaited) so no peer waits on a compile;
    the arguments are specialised as the measured calls' are (aligned flags, the same ints)."""
    own = FlagEnd(torch.zeros(2, device_flags.FLAG_SLOT, dtype=torch.int32, device="cuda"), 0, 0,
                  cfg.warmup + cfg.iters, cfg.wait_timeout_ns)
    own.signal()
    own.wait()
    _sync()


def _flag_row(cfg: Config, rows: int, chunks: int, end_a: FlagEnd, a: dict[str, int], b: dict[str, int],
              data_ok: bool) -> dict[str, object]:
    """A flag round trip's row: A's stamped latencies, and whether either side's waits timed out."""
    samples = chunk_intervals_us(end_a.stamps.tolist(), cfg.warmup, cfg.chunk, chunks)
    return _row(cfg, rows, samples, "device", data_ok=data_ok, a_timed_out=a["timed_out"], b_timed_out=b["timed_out"])


def flags_a(cfg: Config, conn, emit, use_graph: bool) -> None:
    to_b, to_a, flags = _buffers(cfg)
    conn.send((to_b, to_a, flags))
    _compile_flag_kernels(cfg)
    conn.recv()  # B compiled too: no wait below spins through a peer's compile
    stream = torch.cuda.current_stream()
    for i, rows in enumerate(cfg.rows):
        msg, end = _message(cfg, rows), FlagEnd(flags[i], 0, 1, cfg.warmup + cfg.iters, cfg.wait_timeout_ns)

        def step() -> None:
            to_b[:rows].copy_(msg)
            end.signal()
            end.wait()

        conn.send(("size", (i, rows)))
        for _ in range(cfg.warmup):
            step()
        _sync()
        run_chunk = _chunk_runner(cfg, [(stream, step)], use_graph)
        conn.recv()  # B warmed up and captured
        chunks = _run_chunks(cfg, run_chunk, conn)
        conn.send(("stats", chunks * cfg.chunk))
        peer = conn.recv()
        emit(_flag_row(cfg, rows, chunks, end, end.stats(), peer,
                       data_ok=bool(torch.equal(to_a[:rows], msg))))
    conn.send(None)


def flags_b(cfg: Config, conn, emit, use_graph: bool) -> None:
    to_b, to_a, flags = conn.recv()
    _compile_flag_kernels(cfg)
    conn.send("compiled")
    stream = torch.cuda.current_stream()
    state: dict[str, object] = {}

    def prepare(arg) -> str:
        i, rows = arg
        end = FlagEnd(flags[i], 1, 0, cfg.warmup + cfg.iters, cfg.wait_timeout_ns)

        def step() -> None:
            end.wait()
            to_a[:rows].copy_(to_b[:rows])
            end.signal()

        for _ in range(cfg.warmup):
            step()
        _sync()
        state.update(end=end, run_chunk=_chunk_runner(cfg, [(stream, step)], use_graph))
        return "ready"

    def chunk(_) -> bool:
        state["run_chunk"]()
        _sync()
        return True

    _serve(conn, {"size": prepare, "chunk": chunk, "stats": lambda _: state["end"].stats()})


def flags_one_process(cfg: Config, conn, emit) -> None:
    """Both ends in one process on two streams, captured: the flags without time-slicing."""
    to_b, to_a, flags = _buffers(cfg)
    _compile_flag_kernels(cfg)
    s_a, s_b = torch.cuda.Stream(), torch.cuda.Stream()
    for i, rows in enumerate(cfg.rows):
        msg = _message(cfg, rows)
        a = FlagEnd(flags[i], 0, 1, cfg.warmup + cfg.iters, cfg.wait_timeout_ns)
        b = FlagEnd(flags[i], 1, 0, cfg.warmup + cfg.iters, cfg.wait_timeout_ns)

        def step_a() -> None:
            to_b[:rows].copy_(msg)
            a.signal()
            a.wait()

        def step_b() -> None:
            b.wait()
            to_a[:rows].copy_(to_b[:rows])
            b.signal()

        steps = [(s_b, step_b), (s_a, step_a)]
        for _ in range(cfg.warmup):
            for stream, step in steps:
                with torch.cuda.stream(stream):
                    step()
        torch.cuda.synchronize()
        chunks = _run_chunks(cfg, _chunk_runner(cfg, steps, use_graph=True), conn=None)
        emit(_flag_row(cfg, rows, chunks, a, a.stats(), b.stats(), data_ok=bool(torch.equal(to_a[:rows], msg))))


def host_sync_a(cfg: Config, conn, emit) -> None:
    to_b, to_a, flags = _buffers(cfg)
    conn.send((to_b, to_a, flags))
    for rows in cfg.rows:
        msg = _message(cfg, rows)
        samples = _host_paced(cfg, conn, rows, lambda: (to_b[:rows].copy_(msg), _sync()), lambda: None)
        emit(_row(cfg, rows, samples, "host", data_ok=bool(torch.equal(to_a[:rows], msg))))
    conn.send(None)


def host_sync_b(cfg: Config, conn, emit) -> None:
    to_b, to_a, _ = conn.recv()

    def reply(rows: int) -> bool:
        to_a[:rows].copy_(to_b[:rows])
        _sync()
        return True

    _serve(conn, {"rt": reply})


class EventOps:
    """Record and wait on interprocess events the way `mode` asks: torch's calls ('torch', or
    'torch_external' with Event(external=True) for the events this side creates), or the driver's
    cuEventRecordWithFlags / cuStreamWaitEvent with the EXTERNAL flags ('driver_external')."""

    EXTERNAL = 1  # CU_EVENT_RECORD_EXTERNAL == CU_EVENT_WAIT_EXTERNAL, valid only during a capture

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.lib = ctypes.CDLL("libcuda.so.1") if mode == "driver_external" else None
        if self.lib is not None:
            self.lib.cuEventRecordWithFlags.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
            self.lib.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]

    def new_event(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(interprocess=True, external=self.mode == "torch_external")
        ev.ipc_handle()  # creates the event now, not lazily during a capture
        return ev

    def record(self, ev: torch.cuda.Event) -> None:
        stream = torch.cuda.current_stream()
        if self.lib is None:
            ev.record(stream)
        else:
            res = self.lib.cuEventRecordWithFlags(ev.cuda_event, stream.cuda_stream, self._flags())
            self._check(res, "cuEventRecordWithFlags")

    def wait(self, ev: torch.cuda.Event) -> None:
        stream = torch.cuda.current_stream()
        if self.lib is None:
            stream.wait_event(ev)
        else:
            self._check(self.lib.cuStreamWaitEvent(stream.cuda_stream, ev.cuda_event, self._flags()),
                        "cuStreamWaitEvent")

    def _flags(self) -> int:
        return self.EXTERNAL if torch.cuda.is_current_stream_capturing() else 0

    def _check(self, res: int, what: str) -> None:
        if res != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(res, ctypes.byref(name))
            raise RuntimeError(f"{what} returned {res} ({(name.value or b'?').decode()})")


def _exchange_events(conn, ops: EventOps, payload: tuple = ()) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """This side's event (created here) and the peer's (opened from its IPC handle)."""
    mine = ops.new_event()
    conn.send((*payload, mine.ipc_handle()))
    *_, handle = conn.recv()
    return mine, torch.cuda.Event.from_ipc_handle(torch.cuda.current_device(), handle)


def _join_events(conn, ops: EventOps) -> tuple[tuple, torch.cuda.Event, torch.cuda.Event]:
    """B's side of _exchange_events: A's payload, this side's event and A's."""
    *payload, handle = conn.recv()
    mine = ops.new_event()
    conn.send((mine.ipc_handle(),))
    return tuple(payload), mine, torch.cuda.Event.from_ipc_handle(torch.cuda.current_device(), handle)


def ipc_event_eager_a(cfg: Config, conn, emit) -> None:
    ops = EventOps("torch")
    to_b, to_a, flags = _buffers(cfg)
    ev_a, ev_b = _exchange_events(conn, ops, (to_b, to_a, flags))
    for rows in cfg.rows:
        msg = _message(cfg, rows)
        samples = _host_paced(cfg, conn, rows, lambda: (to_b[:rows].copy_(msg), ops.record(ev_a)), ev_b.synchronize)
        emit(_row(cfg, rows, samples, "host", data_ok=bool(torch.equal(to_a[:rows], msg))))
    conn.send(None)


def ipc_event_eager_b(cfg: Config, conn, emit) -> None:
    ops = EventOps("torch")
    (to_b, to_a, _), ev_b, ev_a = _join_events(conn, ops)

    def reply(rows: int) -> bool:
        ops.wait(ev_a)
        to_a[:rows].copy_(to_b[:rows])
        ops.record(ev_b)
        return True

    _serve(conn, {"rt": reply})


# Which of the record (A) and the wait (B) run from a captured graph in each dependency trial.
DEPENDENCY_TRIALS = ((True, False), (False, True), (True, True))


def event_graph_a(cfg: Config, conn, emit, mode: str) -> None:
    ops = EventOps(mode)
    to_b, to_a, flags = _buffers(cfg)
    ev_a, ev_b = _exchange_events(conn, ops, (to_b, to_a, flags))
    r0 = cfg.rows[0]
    src = _message(cfg, r0)

    def publish() -> None:
        to_b[:r0].copy_(src)
        ops.record(ev_a)

    publish_graph, a_capture = _try_capture(publish)
    conn.send(("captures", None))
    b_capture = conn.recv()
    result: dict[str, object] = {"rows": r0, "a_record_capture": a_capture, "b_wait_capture": b_capture["wait"],
                                 "b_round_trip_capture": b_capture["round_trip"]}
    honoured = []
    for trial, (record_in_graph, wait_in_graph) in enumerate(DEPENDENCY_TRIALS, start=1):
        key = f"honoured_record_{'graph' if record_in_graph else 'eager'}_wait_{'graph' if wait_in_graph else 'eager'}"
        if (record_in_graph and publish_graph is None) or (wait_in_graph and b_capture["wait"] != "ok"):
            result[key] = "not run (capture failed)"
            continue
        try:
            torch.cuda._sleep(cfg.sleep_cycles)  # A's write and record land ~50 ms after B issues its wait
            src.fill_(trial)
            if record_in_graph:
                publish_graph.replay()
            else:
                publish()
            conn.send(("dependent_copy", wait_in_graph))
            conn.recv()
            _sync()
        except Exception as e:  # noqa: BLE001 - the error text is the measurement
            result[key] = _describe(e)
            continue
        result[key] = bool((to_a[:r0] == trial).all())
        honoured.append(result[key])
    emit(result)
    if len(honoured) == len(DEPENDENCY_TRIALS) and all(honoured) and b_capture["round_trip"] == "ok":
        for rows in cfg.rows:
            msg = _message(cfg, rows)
            graph = _capture(lambda: (to_b[:rows].copy_(msg), ops.record(ev_a)))
            samples = _host_paced(cfg, conn, rows, graph.replay, ev_b.synchronize)
            emit(_row(cfg, rows, samples, "host", data_ok=bool(torch.equal(to_a[:rows], msg))))
    conn.send(None)


def event_graph_b(cfg: Config, conn, emit, mode: str) -> None:
    ops = EventOps(mode)
    (to_b, to_a, _), ev_b, ev_a = _join_events(conn, ops)
    r0 = cfg.rows[0]

    def dependent_copy() -> None:
        ops.wait(ev_a)
        to_a[:r0].copy_(to_b[:r0])

    wait_graph, wait_capture = _try_capture(dependent_copy)
    round_trips: dict[int, torch.cuda.CUDAGraph] = {}
    round_trip_capture = "ok"
    for rows in cfg.rows:
        graph, round_trip_capture = _try_capture(
            lambda rows=rows: (ops.wait(ev_a), to_a[:rows].copy_(to_b[:rows]), ops.record(ev_b)))
        if graph is None:
            break
        round_trips[rows] = graph

    def dependent(in_graph: bool) -> bool:
        if in_graph:
            wait_graph.replay()
        else:
            dependent_copy()
        _sync()
        return True

    def reply(rows: int) -> bool:
        round_trips[rows].replay()
        return True

    _serve(conn, {"captures": lambda _: {"wait": wait_capture, "round_trip": round_trip_capture},
                  "dependent_copy": dependent, "rt": reply})


@dataclass(frozen=True)
class Option:
    name: str
    roles: tuple[Callable, ...]  # A, and B for a pair of processes


OPTIONS = {o.name: o for o in (
    Option("local_copy", (local_copy,)),
    Option("event_graph_torch", (partial(event_graph_a, mode="torch"), partial(event_graph_b, mode="torch"))),
    Option("event_graph_torch_external",
           (partial(event_graph_a, mode="torch_external"), partial(event_graph_b, mode="torch_external"))),
    Option("event_graph_driver_external",
           (partial(event_graph_a, mode="driver_external"), partial(event_graph_b, mode="driver_external"))),
    Option("flag_graph", (partial(flags_a, use_graph=True), partial(flags_b, use_graph=True))),
    Option("flag_graph_one_process", (flags_one_process,)),
    Option("host_sync", (host_sync_a, host_sync_b)),
    Option("ipc_event_eager", (ipc_event_eager_a, ipc_event_eager_b)),
    Option("flag_eager", (partial(flags_a, use_graph=False), partial(flags_b, use_graph=False))),
)}  # in run order: the open questions first, the eager variants last

# ---------------------------------------------------------------------------- processes


def _child(name: str, role: str, cfg: Config, conn, results) -> None:
    """Runs one role of one option; every row, and how the role ended, goes to `results`."""
    try:
        torch.cuda.set_device(0)
        with torch.cuda.stream(torch.cuda.Stream()):
            OPTIONS[name].roles["ab".index(role)](cfg, conn, lambda row: results.put((role, "row", row)))
            torch.cuda.synchronize()
        results.put((role, "done", None))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which owns the exit
        where = traceback.extract_tb(e.__traceback__)[-1]
        results.put((role, "error", f"{_describe(e)} (line {where.lineno})"))


def run_option(ctx, name: str, cfg: Config, timeout_s: float) -> dict[str, object]:
    """Spawns the option's roles, collects their rows, and kills whatever is still alive at the timeout."""
    roles = "ab"[: len(OPTIONS[name].roles)]
    results = ctx.Queue()
    ends = ctx.Pipe() if len(roles) == 2 else (None,)
    procs = [ctx.Process(target=_child, args=(name, role, cfg, end, results), daemon=True)
             for role, end in zip(roles, ends)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for end in ends:
        if end is not None:
            end.close()  # so that a role whose peer died reads EOF instead of waiting
    out: dict[str, object] = {"option": name, "rows": [], "errors": {}}
    ended: set[str] = set()
    while len(ended) < len(roles) and (left := t0 + timeout_s - time.monotonic()) > 0:
        try:
            role, kind, payload = results.get(timeout=left)
        except queue.Empty:
            break
        if kind == "row":
            out["rows"].append(payload)
        else:
            ended.add(role)
            if kind == "error":
                out["errors"][role] = payload
    hung = [r for r in roles if r not in ended]
    for p in procs:
        p.join(timeout=max(0.5, t0 + timeout_s - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    out["status"] = f"killed after {timeout_s:.0f} s (roles {','.join(hung)} still running)" if hung else (
        "error" if out["errors"] else "ok")
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def _tables(reports: list[dict[str, object]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(round-trip rows, event-capture rows) for printing, each string cut to its first line."""
    first_line = lambda v: str(v).splitlines()[0] if isinstance(v, str) and v else v  # noqa: E731
    timings, captures = [], []
    for rep in reports:
        status = rep["status"] if rep["status"] != "error" else "; ".join(f"{k}: {v}" for k, v in rep["errors"].items())
        for r in rep["rows"] or [{}]:
            row = {"option": rep["option"], **{k: first_line(v) for k, v in r.items()}, "status": first_line(status)}
            (captures if "a_record_capture" in r else timings).append(row)
    return timings, captures


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Config]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where the JSON report goes")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 512], help="message rows (the dispatch batch)")
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--iters", type=int, default=1000, help="measured round trips per size (a multiple of --chunk)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--wait-timeout-ms", type=float, default=2000.0, help="how long a device-side wait spins")
    ap.add_argument("--sleep-cycles", type=int, default=100_000_000, help="~50 ms at the H200's clock")
    ap.add_argument("--option-timeout-s", type=float, default=20.0)
    ap.add_argument("--budget-s", type=float, default=100.0, help="the whole probe, hung options included")
    ap.add_argument("--only", nargs="+", choices=list(OPTIONS), metavar="OPTION",
                    help=f"run only these: {', '.join(OPTIONS)}")
    ns = ap.parse_args(argv)
    if ns.iters % ns.chunk or ns.chunk < 2 or ns.warmup < 1 or min(ns.rows) < 1:
        ap.error("--iters must be a multiple of --chunk (>= 2); --warmup and --rows must be positive")
    cfg = Config(tuple(ns.rows), ns.hidden, ns.iters, ns.warmup, ns.chunk, int(ns.wait_timeout_ms * 1e6),
                 ns.sleep_cycles, size_budget_s=0.5 * ns.option_timeout_s / len(ns.rows))
    return ns, cfg


def main(argv: list[str] | None = None) -> None:
    ns, cfg = _parse(argv)
    if not torch.cuda.is_available():
        sys.exit(NO_CUDA)
    from gpu_timing import table  # needs triton; imported only once there is a GPU

    ctx = mp.get_context("spawn")
    deadline = time.monotonic() + ns.budget_s
    reports = []
    for name in ns.only or OPTIONS:
        left = deadline - time.monotonic()
        if left < 8:  # too little to start two processes and measure
            reports.append({"option": name, "rows": [], "errors": {}, "status": "skipped (probe budget spent)"})
            continue
        reports.append(run_option(ctx, name, cfg, min(ns.option_timeout_s, left)))
        print(f"{name}: {reports[-1]['status']} in {reports[-1]['wall_s']} s", flush=True)
    props = torch.cuda.get_device_properties(0)
    env = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": getattr(triton, "__version__", None), "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
           "date": time.strftime("%Y-%m-%d")}
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    with open(ns.out, "w") as f:
        json.dump({"env": env, "config": asdict(cfg), "options": reports}, f, indent=1)
    timings, captures = _tables(reports)
    print(table(timings, f"AFD message round trips between two processes on one GPU ({props.name}); us"))
    print(table(captures, "Interprocess events inside CUDA graphs: capture and honoured dependency"))
    print(f"wrote {ns.out}")


if __name__ == "__main__":
    main()
