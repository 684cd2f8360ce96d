"""kev serve: the HTTP service (FastAPI on uvicorn), one engine per process.

SIGTERM or Ctrl-C, at any moment (loading included): stop accepting (503 + Retry-After), let
in-flight requests finish for server.shutdown_grace_s, cancel the rest (each caller gets its
cancelled results), close the engine, exit 0 (kev/server/drain.py).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys

from kev.cli.common import add_config_flags, config_and_flags
from kev.cli.flags import FlagValue, add_engine_flags, describe_flags, model_path
from kev.cli.logs import add_log_flags
from kev.errors import KevError

API_KEY_ENV = "KEV_API_KEY"
# argparse dest -> the flag as typed; each sets server.<dest>
_SERVER_FLAGS = {"host": "--host", "port": "--port", "max_body_bytes": "--max-body-bytes",
                 "max_questions": "--max-questions", "max_question_chars": "--max-question-chars",
                 "max_tokens_cap": "--max-tokens-cap", "shutdown_grace_s": "--grace",
                 "max_inflight_requests": "--max-inflight-requests", "access_log": "--no-access-log",
                 "stats_interval_s": "--stats-interval", "model_name": "--served-model-name",
                 "tool_call_parser": "--tool-call-parser"}
log = logging.getLogger("kev.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_arg", nargs="?", metavar="MODEL",
                        help="core.model_path, as `vllm serve MODEL` (the same as --model)")
    add_config_flags(parser)
    add_engine_flags(parser)
    parser.add_argument("--served-model-name", dest="model_name",
                        help="server.model_name: the id /v1/models shows and callers send (vLLM's flag)")
    parser.add_argument("--tool-call-parser", choices=["hermes", "llama3_json"],
                        help="server.tool_call_parser: how tool calls are read from answers (vLLM's flag)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help="accepted for vLLM command lines: Kev always parses tool calls with tool_choice auto")
    parser.add_argument("--host", help="server.host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="server.port (default 8765; 0 picks a free one)")
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (else ${API_KEY_ENV}, else "
                                           f"server.api_key); a flag is visible to every user in `ps`: "
                                           f"set ${API_KEY_ENV} to keep the key out of it")
    parser.add_argument("--no-auth", action="store_true",
                        help="serve without API keys, on purpose (server.auth: none); the log says so")
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

    config, flags = config_and_flags(args, {"deploy": {"mode": "distributed", "nats_url": args.nats_url}}
                                     if args.nats_url else None, _serve_flags(args))
    _check_port_free(config.server.host, config.server.port)
    # a key given but empty (KEV_API_KEY="") is an error naming where, never an open server
    api_key, source = ((args.api_key, "--api-key") if args.api_key is not None else
                       (os.environ[API_KEY_ENV], f"${API_KEY_ENV}") if API_KEY_ENV in os.environ else (None, ""))
    failed: list[Exception] = []
    holder: list[uvicorn.Server] = []

    def stop_on_load_failure(err: Exception) -> None:
        failed.append(err)
        holder[0].should_exit = True

    app = build_app(config, api_key=api_key, on_load_failed=stop_on_load_failure, api_key_source=source,
                    no_auth=args.no_auth)
    grace = config.server.shutdown_grace_s
    uvicorn_config = uvicorn.Config(
        app, host=config.server.host, port=config.server.port, log_level=args.log_level, log_config=None,
        timeout_graceful_shutdown=DrainingServer.timeout_for(grace),  # type: ignore[arg-type]  # float seconds work
        http=guarded_h11(config.server),  # server.max_connections and the slow-socket rules (not limit_concurrency)
        timeout_keep_alive=config.server.keep_alive_s,  # type: ignore[arg-type]  # uvicorn's stub says int; float works
        access_log=args.log_level == "debug",
        # behind a trusted proxy: the client address from X-Forwarded-For (uvicorn's own setting, passed as is)
        proxy_headers=bool(config.server.forwarded_allow_ips),
        forwarded_allow_ips=config.server.forwarded_allow_ips or None)
    server = DrainingServer(uvicorn_config, app.state.service, grace)
    log.info("kev serve: %r as %r on %s:%d%s", config.core.model_path, app.state.service.model_name,
             config.server.host, config.server.port, f"; flags: {describe_flags(flags)}" if flags else "")
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


def _serve_flags(args: argparse.Namespace) -> list[FlagValue]:
    flags = [FlagValue("MODEL", "core.model_path", model_path(args.model_arg))] if args.model_arg else []
    flags += [FlagValue(flag, f"server.{dest}", getattr(args, dest)) for dest, flag in _SERVER_FLAGS.items()
              if getattr(args, dest) is not None]
    if args.no_auth:
        flags.append(FlagValue("--no-auth", "server.auth", "none"))
    if args.api_key:
        flags.append(FlagValue("--api-key", "server.api_key", args.api_key, secret=True))
    return flags


def _check_port_free(host: str, port: int) -> None:
    """A port already taken is one clear line and exit 2, before the model loads (not a traceback after)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise KevError(f"port {port} on {host} is already in use (another server?); pick another with "
                               "--port") from None
            raise KevError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
