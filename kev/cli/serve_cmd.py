"""kev serve: the HTTP service (FastAPI on uvicorn), one engine per process.

SIGTERM or Ctrl-C, at any moment (loading included): stop accepting (503 + Retry-After), let
in-flight requests finish for server.shutdown_grace_s, cancel the rest (each caller gets its
cancelled results), close the engine, exit 0 (kev/server/drain.py).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from kev.cli.common import add_config_flags, config_from_args
from kev.cli.logs import add_log_flags
from kev.errors import KevError

API_KEY_ENV = "KEV_API_KEY"
# flag -> server.<field>
_SERVER_FLAGS = ("host", "port", "max_body_bytes", "max_questions", "max_question_chars", "max_tokens_cap",
                 "shutdown_grace_s", "max_inflight_requests", "access_log", "stats_interval_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--host", help="server.host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="server.port (default 8765; 0 picks a free one)")
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (else ${API_KEY_ENV}, else "
                                           f"server.api_key); a flag is visible to every user in `ps`: "
                                           f"set ${API_KEY_ENV} to keep the key out of it")
    parser.add_argument("--max-body-bytes", type=int, help="server.max_body_bytes")
    parser.add_argument("--max-questions", type=int, help="server.max_questions (per request)")
    parser.add_argument("--max-question-chars", type=int, help="server.max_question_chars")
    parser.add_argument("--max-tokens-cap", type=int, help="server.max_tokens_cap")
    parser.add_argument("--max-inflight-requests", type=int, help="server.max_inflight_requests")
    parser.add_argument("--grace", dest="shutdown_grace_s", type=float, help="server.shutdown_grace_s")
    parser.add_argument("--nats-url",
                        help="deploy.nats_url: be the router of a cluster (implies deploy.mode distributed)")
    parser.add_argument("--no-access-log", dest="access_log", action="store_false", default=None,
                        help="no INFO line per request (server.access_log: false)")
    parser.add_argument("--stats-interval", dest="stats_interval_s", type=float,
                        help="seconds between stats lines while busy (server.stats_interval_s, default 10; 0: off)")
    add_log_flags(parser)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from kev.server.app import build_app
    from kev.server.drain import DrainingServer, exit_if_loading
    from kev.server.slow_clients import guarded_h11

    server_overrides = {name: getattr(args, name) for name in _SERVER_FLAGS if getattr(args, name) is not None}
    overrides = {"server": server_overrides} if server_overrides else {}
    if args.nats_url:
        overrides["deploy"] = {"mode": "distributed", "nats_url": args.nats_url}
    config = config_from_args(args, overrides)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    failed: list[Exception] = []
    holder: list[uvicorn.Server] = []

    def stop_on_load_failure(err: Exception) -> None:
        failed.append(err)
        holder[0].should_exit = True

    app = build_app(config, api_key=api_key, on_load_failed=stop_on_load_failure)
    grace = config.server.shutdown_grace_s
    uvicorn_config = uvicorn.Config(
        app, host=config.server.host, port=config.server.port, log_level=args.log_level, log_config=None,
        timeout_graceful_shutdown=DrainingServer.timeout_for(grace),  # type: ignore[arg-type]  # float seconds work
        http=guarded_h11(config.server),  # server.max_connections and the slow-socket rules (not limit_concurrency)
        timeout_keep_alive=config.server.keep_alive_s,  # type: ignore[arg-type]  # uvicorn's stub says int; float works
        access_log=args.log_level == "debug")
    server = DrainingServer(uvicorn_config, app.state.service, grace)
    holder.append(server)
    # uvicorn re-raises the SIGTERM/SIGINT it handled once it is done; a no-op handler lets us exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if failed and isinstance(failed[0], KevError):  # a model it cannot run: the same one line as every command
        print(f"kev serve: {failed[0]}", file=sys.stderr)
        return 2
    if failed:
        print("kev serve: the model failed to load (see the log above)", file=sys.stderr)
        return 1
    code = 0 if server.started else 1
    exit_if_loading(app.state.service, code)
    return code
