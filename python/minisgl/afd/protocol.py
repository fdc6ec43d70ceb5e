"""What the coordinator and the workers exchange: the spec a worker starts from, then step plans and
replies (one plan per worker per step, never per layer), and a worker's last word when it fails.
Small frozen dataclasses, validated on construction, pickled over ZMQ."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.afd.args import AfdArgs
from minisgl.engine.plan import EnginePlan
from minisgl.engine.warmup import StepShape
from minisgl.kvcache.hybrid_pool import PoolConfig
from minisgl.sampling_params import SamplingParams

ATTN, EXPERT = "attn", "expert"  # WorkerSpec.role


@dataclass(frozen=True)
class WorkerSpec:
    role: str  # ATTN or EXPERT
    index: int  # lane index (ATTN) or expert-parallel rank (EXPERT)
    rank: int  # rank in the torch.distributed world: attention lanes' ranks first, then expert workers
    store_addr: tuple[str, int]  # the coordinator's TCPStore, which every rank rendezvouses through
    plan_addr: str  # the coordinator's PUSH socket for this worker
    reply_addr: str  # the coordinator's PULL socket for all replies
    engine_plan: EnginePlan  # the coordinator's; a worker takes .on_device(device)
    afd_args: AfdArgs
    device: str
    parent_pid: int | None = None  # local launcher: exit when the coordinator process is gone
    tp_rank: int = 0  # rank inside the attention lane (--afd-attn-tp-size)
    max_bucket: int = 0  # the largest dispatch bucket any step uses: what the ipc transport's buffers hold
    # Run in lock step before the attention workers' pools are planned (afd/pool_sizing.py); () when
    # the flags size them (the CPU, --num-pages).
    probe_steps: tuple[WarmupStep, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}" + (f".tp{self.tp_rank}" if self.tp_rank else "")


@dataclass(frozen=True)
class Ready:
    """A worker's first word: it is built, with decode graphs prepared for these micro-batch
    buckets (on the CPU, the ones it would capture; () when decode steps are not planned in buckets).
    An attention worker whose pool was planned says how (the coordinator sizes its lane from it)."""

    worker: str
    graph_buckets: tuple[int, ...]
    pool: PoolConfig | None = None  # None: the flags' pool
    memory: str = ""  # the planner's line


@dataclass(frozen=True)
class WorkerFailed:
    """Sent (best effort) before a worker exits on an error, so the coordinator can say why."""

    worker: str
    error_type: str
    message: str


@dataclass(frozen=True)
class NewRequest:
    """A request entering a lane: its slot gets zeroed state and its own sampler."""

    rid: str  # the coordinator's id for this admission, never reused (not the client's rid)
    slot: int
    params: SamplingParams


@dataclass(frozen=True)
class PageAssignment:
    """Pages [start, start + len(pages)) of the slot's table row."""

    slot: int
    start: int
    pages: tuple[int, ...]


@dataclass(frozen=True)
class ReqStep:
    """One request's share of a step. `tokens` is a prefill chunk; None means a decode of the token
    the worker sampled for this slot last time (kept on the device, so no CPU round trip)."""

    rid: str  # the coordinator's id for this admission
    slot: int
    prefix_len: int
    extend_len: int
    tokens: tuple[int, ...] | None
    sample: bool  # this step's last logits produce the request's next token

    def __post_init__(self) -> None:
        if self.slot < 1:
            raise ValueError(f"request {self.rid}: slot {self.slot} is the dummy slot")
        if self.extend_len < 1 or self.prefix_len < 0:
            raise ValueError(f"request {self.rid}: bad extend {self.extend_len} after prefix {self.prefix_len}")
        if self.tokens is None and self.extend_len != 1:
            raise ValueError(f"request {self.rid}: a decode extends by exactly one token")
        if self.tokens is not None and len(self.tokens) != self.extend_len:
            raise ValueError(f"request {self.rid}: {len(self.tokens)} tokens for an extend of {self.extend_len}")


@dataclass(frozen=True)
class AgPlan:
    """An attention worker's step: micro-batches of its lane's requests, plus pool updates applied
    in this order before the forward: frees, new requests, page assignments."""

    step: int
    bucket: int  # dispatch capacity in tokens per micro-batch, agreed by every rank this step
    micro_batches: tuple[tuple[ReqStep, ...], ...]
    free_slots: tuple[int, ...] = ()
    new_requests: tuple[NewRequest, ...] = ()
    pages: tuple[PageAssignment, ...] = ()
    # Replay the decode graph of `bucket` (every micro-batch padded to it); every plan of the step agrees.
    use_graph: bool = False

    def __post_init__(self) -> None:
        if not self.micro_batches:
            raise ValueError("a plan needs at least one micro-batch")
        if self.use_graph and any(r.tokens is not None for mb in self.micro_batches for r in mb):
            raise ValueError(f"step {self.step}: a graph step holds decodes only, not prefill chunks")
        for mb in self.micro_batches:
            tokens = sum(r.extend_len for r in mb)
            if tokens > self.bucket:
                raise ValueError(f"step {self.step}: a micro-batch of {tokens} tokens exceeds the bucket {self.bucket}")
        slots = [r.slot for mb in self.micro_batches for r in mb]
        if len(slots) != len(set(slots)):
            raise ValueError(f"step {self.step}: a slot appears twice")

    @property
    def num_mb(self) -> int:
        return len(self.micro_batches)


@dataclass(frozen=True)
class EgPlan:
    """An expert worker's step. Routing travels with the data, so this is all it needs."""

    step: int
    num_mb: int
    bucket: int
    phase: str  # "prefill" (some chunk in the step) or "decode"; for logs and metrics
    use_graph: bool = False  # as every AgPlan of the step

    def __post_init__(self) -> None:
        if self.num_mb < 1 or self.bucket < 1:
            raise ValueError(f"step {self.step}: num_mb {self.num_mb} and bucket {self.bucket} must be >= 1")
        if self.phase not in ("prefill", "decode"):
            raise ValueError(f"step {self.step}: unknown phase {self.phase!r}")
        if self.use_graph and self.phase != "decode":
            raise ValueError(f"step {self.step}: a graph step holds decodes only, not a {self.phase} phase")


@dataclass(frozen=True)
class WarmupStep:
    """A step before the coordinator reports ready, sent alike to every worker (each lane's ranks
    and every expert worker), in the same order: each lane runs `micro_batches` on the dummy state
    slot and page only, and the exchange runs at `bucket` (and `use_graph`) as a real step of that
    shape would. An empty shape is an idle micro-batch (a graph step pads it, as a real one does)."""

    step: int  # warm-up steps count from 0; real steps are numbered apart
    bucket: int
    use_graph: bool
    phase: str  # "prefill" or "decode", as EgPlan
    micro_batches: tuple[StepShape, ...]
    last: bool = False  # the warm-up's last step: an attention worker checks its pool is still empty

    def __post_init__(self) -> None:
        EgPlan(self.step, self.num_mb, self.bucket, self.phase, self.use_graph)  # the same rules
        for shape in self.micro_batches:
            if len(shape.extend) != len(shape.prefix) or any(n < 1 for n in shape.extend):
                raise ValueError(f"warm-up step {self.step}: bad micro-batch {shape}")
            if shape.num_tokens > self.bucket or (self.use_graph and any(n != 1 for n in shape.extend)):
                raise ValueError(f"warm-up step {self.step}: micro-batch {shape} does not fit bucket {self.bucket} "
                                 f"(graph: {self.use_graph})")

    @property
    def num_mb(self) -> int:
        return len(self.micro_batches)


@dataclass(frozen=True)
class WarmupReply:
    """A worker's answer to a warm-up step: what the step cost it, for a planner of the attention
    workers' pools. peak_bytes: device memory allocated at the step's peak beyond what was allocated
    before it (None off CUDA); compiles: Triton compiles and autotuning runs during the step;
    graphs: the decode-step CUDA graphs the worker holds after the step (afd/step_graphs.py)."""

    step: int
    worker: str
    peak_bytes: int | None
    compiles: int
    graphs: int = 0


@dataclass(frozen=True)
class Shutdown:
    """Tells a worker to exit its loop."""


@dataclass(frozen=True)
class Reply:
    """A worker's answer for one retired step: (rid, token) for every request that sampled, and the
    host seconds its launch took (enqueueing the step's work, not running it)."""

    step: int
    worker: str
    tokens: tuple[tuple[str, int], ...] = ()
    launch_s: float = 0.0
