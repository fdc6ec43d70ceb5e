"""`minisgl serve`: three processes joined by ZMQ over IPC sockets in a private temp dir.

    API server (this process: HTTP, tokenization, chat template, response formatting)
      -> engine process (RequestScheduler + Engine)
      -> detokenizer process (incremental text)
      -> back to the API server

The children exit when this process goes away (they watch their parent), and this process turns
a dead child into 503s (EngineClient's watchdog) rather than exiting, so clients see the reason.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import tempfile
from multiprocessing.process import BaseProcess

import uvicorn

from minisgl.afd.args import AfdArgs
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_defaults import load_sampling_defaults
from minisgl.scheduler.args import SchedulerArgs
from minisgl.server.admission import Admission
from minisgl.server.app import build_app
from minisgl.server.args import ServerArgs
from minisgl.server.channel import Addresses
from minisgl.server.detokenizer_process import detokenizer_main
from minisgl.server.engine_client import EngineClient
from minisgl.server.engine_process import engine_main
from minisgl.server.metrics import ServerMetrics
from minisgl.server.serving import ServingContext
from minisgl.tokenizer.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

CHILD_STOP_TIMEOUT = 5.0  # seconds for a child to exit after terminate() before it is killed
TINY_MODEL_NAME = "minisgl-tiny"


def _stop(procs: dict[str, BaseProcess]) -> None:
    for p in procs.values():
        if p.is_alive():
            p.terminate()
    for p in procs.values():
        p.join(CHILD_STOP_TIMEOUT)
        if p.is_alive():
            p.kill()
            p.join(CHILD_STOP_TIMEOUT)


def serve(engine_args: EngineArgs, sched_args: SchedulerArgs, server_args: ServerArgs, afd: AfdArgs | None) -> None:
    name = server_args.served_model_name or engine_args.model_path or TINY_MODEL_NAME
    plan = resolve_plan(engine_args)
    model_path = plan.model_path
    defaults = load_sampling_defaults(model_path, server_args.generation_config)
    logger.info("%s", defaults.describe())
    spawn = mp.get_context("spawn")  # fork would copy the API server's sockets and threads
    with tempfile.TemporaryDirectory(prefix="minisgl-ipc-") as ipc_dir:
        addrs = Addresses.in_dir(ipc_dir)
        me, level = os.getpid(), server_args.log_level
        procs: dict[str, BaseProcess] = {
            "engine": spawn.Process(target=engine_main, args=(plan, sched_args, afd, addrs, me, level),
                                    name="minisgl-engine"),
            "detokenizer": spawn.Process(target=detokenizer_main, args=(model_path, addrs, me, level),
                                         name="minisgl-detokenizer"),
        }
        for p in procs.values():
            p.start()
        try:
            tokenizer = load_tokenizer(model_path)
            metrics = ServerMetrics(name)

            def make_context() -> ServingContext:
                client = EngineClient(addrs, procs, server_args.watchdog_timeout, metrics.on_stats,
                                      metrics.on_engine_dead)
                admission = Admission(client, server_args.max_queued_requests, server_args.max_logprob_entries)
                return ServingContext(client, tokenizer, name, metrics, admission, defaults,
                                      server_args.reasoning_parser, server_args.tool_call_parser)

            app = build_app(make_context, server_args)
            uvicorn.run(app, host=server_args.host, port=server_args.port, log_level=server_args.log_level,
                        timeout_graceful_shutdown=CHILD_STOP_TIMEOUT)
        finally:
            _stop(procs)
