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
from minisgl.process_setup import name_process
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
from minisgl.server.request_log import RequestLog
from minisgl.server.serving import ServingContext
from minisgl.startup_checks import bind_port, check_startup
from minisgl.tokenizer.tokenizer import load_tokenizer
from minisgl.models.tiny.default import describe as describe_tiny_model

logger = logging.getLogger(__name__)

CHILD_STOP_TIMEOUT = 5.0  # seconds for a child to exit after terminate() before it is killed
STARTUP_FAILED = 3  # exit status when the server never became ready (uvicorn's)
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


def served_name(engine_args: EngineArgs, server_args: ServerArgs) -> str:
    """What /v1/models lists and requests send: --served-model-name, else the checkpoint folder's
    name (never its path, which is the server's business)."""
    if server_args.served_model_name:
        return server_args.served_model_name
    if engine_args.model_path is None:
        return TINY_MODEL_NAME
    return os.path.basename(os.path.normpath(engine_args.model_path))


def serve(engine_args: EngineArgs, sched_args: SchedulerArgs, server_args: ServerArgs, afd: AfdArgs | None) -> None:
    # Every start-up mistake is found here, before a process starts or a weight loads.
    check_startup(engine_args.device, engine_args.model_path, engine_args.load_format)
    sock = bind_port(server_args.host, server_args.port)
    if engine_args.model_path is None:
        logger.info("model: %s", describe_tiny_model())
    if engine_args.load_format == "dummy":
        logger.warning("--load-format dummy: the weights are seeded random values, so answers are noise "
                       "(for measuring real shapes without a checkpoint)")
    name_process("minisgl-api")
    name = served_name(engine_args, server_args)
    plan = resolve_plan(engine_args)
    model_path = plan.model_path
    defaults = load_sampling_defaults(model_path, server_args.generation_config)
    logger.info("%s", defaults.describe())
    spawn = mp.get_context("spawn")  # fork would copy the API server's sockets and threads
    with sock, tempfile.TemporaryDirectory(prefix="minisgl-ipc-") as ipc_dir:
        addrs = Addresses.in_dir(ipc_dir)
        me = os.getpid()
        procs: dict[str, BaseProcess] = {
            "engine": spawn.Process(target=engine_main, name="minisgl-engine", args=(
                plan, sched_args, afd, addrs, me, server_args.decode_log_interval)),
            "detokenizer": spawn.Process(target=detokenizer_main, args=(model_path, addrs, me),
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
                                      server_args.reasoning_parser, server_args.tool_call_parser,
                                      RequestLog(server_args.log_requests))

            app = build_app(make_context, server_args)
            # The access log (a line per request) only when --log-level-http asks for info or debug.
            server = uvicorn.Server(uvicorn.Config(
                app, log_level=server_args.log_level_http or server_args.log_level,
                access_log=server_args.log_level_http in ("info", "debug"), timeout_graceful_shutdown=CHILD_STOP_TIMEOUT,
                timeout_keep_alive=server_args.timeout_keep_alive))
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down gracefully and re-raised it
                return
            if not server.started:  # the engine failed to start; the log above says why
                raise SystemExit(STARTUP_FAILED)
        finally:
            _stop(procs)
