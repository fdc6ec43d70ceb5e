"""Engine: loads the model and its weights onto the plan's device, owns the hybrid pool and the
backends, and runs one batched forward per step. Also the entry point of a TP follower process,
which runs an Engine of its own (engine/tp_group.py)."""
from __future__ import annotations

import gc
import logging
import sys
import time
import traceback
from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import zmq
from torch import nn

from minisgl.engine import compile_watch
from minisgl.engine.allocator_settings import prefer_expandable_segments
from minisgl.engine.device_memory import DevicePreparation, prepare_on_device
from minisgl.engine.graph import DecodeGraphRunner
from minisgl.engine.piecewise_graph import PiecewiseGraphRunner, piecewise_buckets
from minisgl.engine.plan import EnginePlan
from minisgl.engine.tp_group import (
    JOIN_TIMEOUT_S, JOINING, READY, FollowerSpec, JournaledPool, TpGroup, TpStep, follow, init_group, status_key,
)
from minisgl.engine.warmup import largest_prefill, shape_batch
from minisgl.forward_batch import ForwardBatch, Snapshot
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig
from minisgl.models.config import ModelConfig
from minisgl.models.context import Backends
from minisgl.models.dummy_weights import init_dummy_weights
from minisgl.models.materialize import build_module
from minisgl.models.registry import MODELS
from minisgl.models.sharding import check_parallel
from minisgl.models.weights import WeightFilter, load_weights
from minisgl.parallel.collectives import broadcast_from_leader
from minisgl.parallel.config import SINGLE, ParallelConfig
from minisgl.process_setup import name_process, set_loading_bar, setup_logging

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        plan: EnginePlan,
        weight_filter: WeightFilter | None = None,
        mlp_factory: Callable[[int], nn.Module] | None = None,
        max_prefill_tokens: int = 16384,
        warm_up: bool = True,
        parallel: ParallelConfig | None = None,
        pool_later: bool = False,
    ) -> None:
        """mlp_factory(layer_id) replaces the local MoE blocks (an AFD attention worker's remote ones).
        warm_up=False skips the device's warm-up and memory planning: an AFD attention worker's steps
        need its expert workers in lock-step, so it cannot run them alone (its pool is the flags', or
        with pool_later the one afd/pool_probe.py plans). max_prefill_tokens is the largest prefill step the scheduler will run.
        pool_later: start on a scratch pool (one slot, the flags' table width) until allocate_pool
        gets the planned one (an AFD attention worker plans after lock-step probe steps).

        parallel: this process's rank of a TP group that someone else started (a colocated
        follower, a rank of an AFD lane). Without it and with --tp-size > 1, this engine starts
        the followers (engine/tp_group.py) and is their rank 0."""
        started = time.monotonic()
        group: TpGroup | None = None
        if parallel is None:
            check_parallel(plan.config, plan.args.tp_size, plan.args.ep_size)
            if plan.args.tp_size > 1:
                group = TpGroup(plan, max_prefill_tokens, follower_main)
                parallel = group.parallel
                plan = plan.on_device(group.devices[0])
        self.plan = plan
        self.parallel = parallel or SINGLE
        self.followers: TpGroup | None = None  # set once this rank 0 is ready to serve
        self.piecewise_bytes = 0  # device memory the piecewise CUDA graphs hold
        try:
            self._build(weight_filter, mlp_factory, max_prefill_tokens, warm_up, journaled=group is not None,
                        pool_later=pool_later)
            if group is not None:
                group.wait_for(READY)
        except BaseException:
            if group is not None:
                group.close(timeout_s=0)
            raise
        self.followers = group
        self.startup_seconds = time.monotonic() - started
        if not pool_later:  # the planner that sizes it later logs it
            self._log_pool()

    @property
    def config(self) -> ModelConfig:
        return self.plan.config

    @property
    def device(self) -> torch.device:
        return self.plan.device

    @property
    def dtype(self) -> torch.dtype:
        return self.plan.dtype

    @property
    def model_path(self) -> str:
        return self.plan.model_path

    def _build(
        self, weight_filter: WeightFilter | None, mlp_factory: Callable[[int], nn.Module] | None,
        max_prefill_tokens: int, warm_up: bool, journaled: bool, pool_later: bool = False,
    ) -> None:
        plan = self.plan
        backends = plan.backends.build()
        arch = MODELS.get(plan.config.arch)
        measured = plan.measure_pool and warm_up
        expandable = False
        if plan.device.type == "cuda":
            compile_watch.install()
            expandable = measured and prefer_expandable_segments()
        self.model = build_module(
            lambda: arch(plan.config, backends, mlp_factory, self.parallel), plan.dtype, plan.device, plan.fp8
        )
        if plan.args.load_format == "dummy":
            init_dummy_weights(self.model, plan.args.seed)
        else:
            load_weights(self.model, plan.model_path, plan.config, weight_filter)
        self.model.eval()
        self.layout = plan.layout(self.parallel)
        self.preparation: DevicePreparation | None = None
        self.gdn_group_tokens: int | None = None  # the warm-up's choice (engine/device_memory.py); None: default
        with compile_watch.warming_up():
            # Before the planner measures what is free, so the graphs' memory is counted as taken.
            self.prefill_graphs = self._capture_piecewise(backends, remote_moe=mlp_factory is not None)
            if measured:
                self.preparation = prepare_on_device(plan, self.model, self.layout, self.parallel, max_prefill_tokens,
                                                     expandable)
                self.pool_cfg = self.preparation.pool_config
                self.gdn_group_tokens = self.preparation.gdn_group_tokens
            else:
                self.pool_cfg = plan.pool
            self.max_seq_len = self.pool_cfg.max_seq_len
            if pool_later:
                flags = plan.pool
                self.pool = HybridPool.scratch(self.layout, flags.max_seq_len, flags, plan.dtype, plan.device)
            else:
                self.pool = (JournaledPool if journaled else HybridPool)(self.layout, self.pool_cfg, plan.dtype,
                                                                         plan.device)
            self.graph_runner = self._capture_graphs(backends)
            if measured:
                graph_top = self.graph_runner.buckets[-1] if self.graph_runner is not None else 0
                self.preparation.warm_up_final(plan, self.pool.max_running, self.max_seq_len, graph_top,
                                               self.make_batch, self.forward_batch)

    def drop_pool(self) -> None:
        """Let go of the pool (the scratch one, before what is free is measured); allocate_pool follows."""
        self.pool = None
        gc.collect()
        torch.cuda.empty_cache()

    def allocate_pool(self, cfg: PoolConfig) -> None:
        """The planned pool, in place of the scratch one (pool_later); no decode graphs hold the old one."""
        if self.graph_runner is not None:
            raise RuntimeError("the decode graphs hold the pool; it cannot be replaced")
        self.pool = None
        self.pool_cfg, self.max_seq_len = cfg, cfg.max_seq_len
        self.pool = HybridPool(self.layout, cfg, self.dtype, self.device)

    def close(self) -> None:
        """Stop the TP followers this engine started (nothing to do otherwise)."""
        if self.followers is not None:
            self.followers.close()
            self.followers = None

    def warmup_summary(self) -> dict[str, object]:
        """What warm-up cost and what the planner chose, for /server_info."""
        prep = self.preparation
        if prep is None:
            return {}
        return {"warmup_seconds": prep.warmup_seconds, "warmup_compiles": prep.warmup_compiles,
                "memory": prep.describe(self.startup_seconds),
                "piecewise_graph_buckets": tuple(self.prefill_graphs.buckets) if self.prefill_graphs else (),
                "piecewise_graph_gib": round(self.piecewise_bytes / 2**30, 3)}

    def _log_pool(self) -> None:
        logger.info("prefix cache %s", f"on: idle slots and pages keep what requests fed, {self.pool_cfg.cache_slots} "
                    "slots beyond the running requests' only for it (--disable-radix-cache turns it off)"
                    if self.pool_cfg.prefix_cache else "off")
        if self.preparation is not None:
            logger.info("%s", self.preparation.describe(self.startup_seconds))
            return
        kv_mb = (self.pool.kv.nbytes if self.pool.kv else 0) / 2**20
        state_mb = (self.pool.state.nbytes if self.pool.state else 0) / 2**20
        logger.info(
            "pool: %d KV pages of %d tokens (%.1f MiB), %d state slots (%.1f MiB, %d of them the prefix cache's); "
            "max concurrency %d at %d tokens",
            self.pool.total_pages, self.pool.page_size, kv_mb, self.pool.num_slots, state_mb, self.pool_cfg.cache_slots,
            min(self.pool.max_running, self.pool.total_pages // self.pool_cfg.pages_per_request), self.max_seq_len,
        )

    def _capture_graphs(self, backends: Backends) -> DecodeGraphRunner | None:
        if not self.plan.cuda_graphs:
            return None
        unsafe = backends.graph_unsafe()
        if unsafe:
            logger.warning("CUDA graphs off: %s synchronise with the host in decode", ", ".join(unsafe))
            return None
        max_bs = self.plan.args.cuda_graph_max_bs or self.pool.max_running
        runner = DecodeGraphRunner(self._forward, self.pool, self.max_seq_len, max_bs)
        logger.info("captured decode CUDA graphs for batch sizes %s", runner.buckets)
        return runner

    def _capture_piecewise(self, backends: Backends, remote_moe: bool) -> PiecewiseGraphRunner | None:
        top = self.plan.piecewise_max_tokens
        off = ("--piecewise-cuda-graph-max-tokens 0 or CUDA graphs off" if top == 0 else
               "an AFD attention worker's MoE exchanges outside the graphs" if remote_moe else
               "TP ranks replay the leader's steps eagerly" if self.parallel.tp_size > 1 else
               f"{type(backends.moe).__name__} synchronises with the host" if not backends.moe.cuda_graph_safe else "")
        if off:
            if top:
                logger.info("piecewise CUDA graphs off: %s", off)
            return None
        flags, chunk = self.plan.pool, self.plan.args.chunked_prefill_size
        scratch = HybridPool.scratch(self.layout, flags.max_seq_len, flags, self.dtype, self.device)

        def make(tokens: int) -> ForwardBatch:
            return shape_batch(largest_prefill(tokens, chunk, flags.max_seq_len),
                               lambda t, p, s: ForwardBatch.build(t, p, s, scratch.page_table, flags.page_size,
                                                                  self.device),
                               self.config.vocab_size)

        torch.cuda.empty_cache()  # so the reserved memory before counts only what is held
        started, reserved = time.monotonic(), torch.cuda.memory_reserved(self.device)
        runner = PiecewiseGraphRunner(self.model, scratch, make, piecewise_buckets(top, chunk))
        del scratch
        torch.cuda.empty_cache()
        self.piecewise_bytes = torch.cuda.memory_reserved(self.device) - reserved
        logger.info("captured piecewise CUDA graphs for prefill and mixed steps of %d buckets up to %d tokens in "
                    "%.1f s (%.2f GiB)", len(runner.buckets), top, time.monotonic() - started, self.piecewise_bytes / 2**30)
        return runner

    def make_batch(self, tokens: list[list[int]], prefix_lens: list[int], slots: list[int],
                   snapshots: Sequence[Snapshot] = ()) -> ForwardBatch:
        return ForwardBatch.build(tokens, prefix_lens, slots, self.pool.page_table, self.pool.page_size, self.device,
                                  self.gdn_group_tokens, snapshots)

    @torch.inference_mode()
    def forward_batch(self, batch: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [R, V] of the flat token rows `rows` (default: each request's last token, [B, V])."""
        if self.followers is not None:
            self.followers.send(TpStep(self.pool.take_ops(), batch.prefix_lens, batch.extend_lens, batch.slot_ids,
                                       None if rows is None else rows.numel(), batch.snapshots))
        if rows is None and self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        if self.prefill_graphs is not None and self.prefill_graphs.can_run(batch):
            return self.prefill_graphs.replay(batch, self.pool, rows)
        return self._forward(batch, self.pool, rows)

    def _forward(self, batch: ForwardBatch, pool: HybridPool, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The step every TP rank runs (and a decode graph captures): rank 0's input ids (and logit
        rows), then the model."""
        if self.parallel.tp_size > 1:
            broadcast_from_leader(batch.input_ids, self.parallel)
            if rows is not None:
                broadcast_from_leader(rows, self.parallel)
        return self.model(batch, pool, rows)


def follower_main(spec: FollowerSpec) -> None:
    """Process entry point of TP rank spec.rank > 0: join rank 0's group, build this rank's engine,
    then run rank 0's steps until it says stop or is gone."""
    name_process(f"minisgl-tp{spec.rank}")
    setup_logging(f"tp{spec.rank}")
    set_loading_bar(None)  # rank 0 draws the group's bar
    host, port = spec.store_addr
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=JOIN_TIMEOUT_S))
    try:
        device = spec.plan.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(1)
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.connect(spec.step_addr)
        store.set(status_key(spec.rank), JOINING)
        parallel = init_group("nccl" if device.type == "cuda" else "gloo", store, spec.rank, spec.plan.args)
        engine = Engine(spec.plan, max_prefill_tokens=spec.max_prefill_tokens, parallel=parallel)
        store.set(status_key(spec.rank), READY)
        follow(engine, sock, spec.parent_pid)
    except BaseException as e:  # noqa: BLE001 - rank 0 reads the reason from the store, then we exit
        store.set(status_key(spec.rank), f"{type(e).__name__}: {e}")
        traceback.print_exc()
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
