"""The `server:` section of kev.yaml: what `kev serve` listens on and the limits it enforces on callers.

It lives with the config, not the server: loading a config never imports the server.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DEFAULT_TENANT = "default"  # the tenant of server.api_key, of an open server, and of library callers


class KeySource(BaseModel):
    """Where an API key is read at start-up: an environment variable or a file (its first line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> KeySource:
        if (self.env is None) == (self.file is None):
            raise ValueError("a key source names exactly one of env (a variable) or file (a path)")
        return self


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    # Bearer token every route but /healthz requires; the CLI flag and KEV_API_KEY override it. It is the key of
    # one tenant, "default" (docs/security.md).
    api_key: str | None = Field(None, min_length=1)
    # auto: keys when any is configured, else an open server (a laptop's default; the log says so). keys: refuse to
    # start without one. none: an open server on purpose (also --no-auth): every caller is tenant "default" and the
    # operator; the banner says so, and setting a key as well is an error.
    auth: Literal["auto", "keys", "none"] = "auto"
    # Tenants: name -> key (a string, or {env: VAR} / {file: PATH}, read at start-up). Each tenant sees only its own
    # requests, files and batches; under loose its prompts are cached for itself alone.
    api_keys: dict[str, str | KeySource] = {}
    api_keys_file: str | None = None  # more tenants: lines "TENANT KEY" ('#' starts a comment line), read at start-up
    # The operator's key: /metrics (prefix cache counters per tenant), /v1/stats, the full /v1/channels view.
    # None: with one tenant, that tenant is the operator; with several, nobody is.
    operator_key: str | KeySource | None = None
    model_name: str | None = None  # id shown by /v1/models; default: the name of core.model_path
    max_body_bytes: int = Field(1 << 20, ge=64)
    max_questions: int = Field(256, ge=1)  # questions per request (and prompts x n for the OpenAI routes)
    max_question_chars: int = Field(32_000, ge=1)  # characters per question, all its messages together
    # A cap on max_tokens for HTTP callers, at most router.max_tokens_cap (None: that cap).
    max_tokens_cap: int | None = Field(None, ge=1)
    max_timeout_ms: int = Field(600_000, ge=1)
    # Requests answered or streamed at once; one more is a 429.
    max_inflight_requests: int = Field(256, ge=1)
    retry_after_s: int = Field(1, ge=1)  # the Retry-After a 429/503 suggests
    # Slow clients: request headers, then the body, must arrive within these (else 408, connection closed);
    # connections beyond max_connections get a 503; an idle keep-alive connection closes after keep_alive_s.
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(512, ge=1)
    # Slow or idle sockets cannot starve real clients (kev/server/connection_book.py): one client address holds at
    # most max_connections_per_client connections (more: 503); connections that have not yet sent a whole request
    # leave connection_reserve slots free (a new one evicts the longest waiting); the header and body deadlines
    # shorten once the server is half full, to a tenth when full.
    max_connections_per_client: int = Field(256, ge=1)
    connection_reserve: int | None = Field(None, ge=0)  # None: an eighth of max_connections
    # uvicorn's setting: proxies (IPs, networks, or "*") whose X-Forwarded-For names the client (request logs,
    # tenants' addresses, the per-client cap): a proxy's own address has no cap (it carries many clients); each
    # request through it counts against its forwarded client from its headers until answered (slow_clients.py).
    forwarded_allow_ips: list[str] = Field(default_factory=list)
    keep_alive_s: float = Field(5.0, gt=0)
    shutdown_grace_s: float = Field(10.0, ge=0)  # SIGTERM: in-flight requests may finish this long, then are cancelled
    access_log: bool = True  # one INFO line per request (id, questions, statuses, latency) on logger kev.access
    stats_interval_s: float = Field(10.0, ge=0)  # a throughput / queue / KV usage line this often while busy; 0: never
    result_ttl_s: float = Field(600.0, gt=0)  # how long results of an async request stay readable after it finished
    max_retained_results: int = Field(1024, ge=1)  # finished async requests kept at most (oldest forgotten first)
    # How tool calls are read out of an answer with tool_choice auto (vLLM's --tool-call-parser): hermes is
    # <tool_call>{"name", "arguments"}</tool_call> (Hermes, Qwen 2.5/3); llama3_json a bare {"name", "parameters"}.
    tool_call_parser: Literal["hermes", "llama3_json"] = "hermes"

    @field_validator("api_keys")
    @classmethod
    def _tenant_names(cls, keys: dict[str, str | KeySource]) -> dict[str, str | KeySource]:
        for name in keys:
            if not TENANT_NAME.match(name) or name == "operator":
                raise ValueError(f"server.api_keys: {name!r} is not a tenant name (letters, digits, '_', '.', '-', "
                                 "at most 64; 'operator' is the operator key's)")
        return keys

    @property
    def reserve_slots(self) -> int:
        return self.max_connections // 8 if self.connection_reserve is None else self.connection_reserve

    @model_validator(mode="after")
    def _reserve_fits(self) -> ServerConfig:
        if self.connection_reserve is not None and self.connection_reserve >= self.max_connections:
            raise ValueError(f"server.connection_reserve ({self.connection_reserve}) must be less than "
                             f"server.max_connections ({self.max_connections})")
        return self
