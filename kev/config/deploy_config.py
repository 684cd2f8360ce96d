"""The `deploy:` section of kev.yaml: single process, one engine per device, or services over NATS JetStream.

It imports nothing from Kev so that kev/config/schema.py can embed it without a cycle.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_PREFIX = re.compile(r"^[A-Za-z0-9_-]+$")  # one subject token; also valid in stream and KV bucket names
_URL = re.compile(r"^(nats|tls|ws|wss)://[^\s,]+$")


class NatsTls(BaseModel):
    """TLS towards the NATS servers; every path is a PEM file, handed to Python's ssl module as-is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: str | None = None  # trust these CAs (default: the system's)
    cert_file: str | None = None  # client certificate (mutual TLS), with key_file
    key_file: str | None = None
    hostname: str | None = None  # expected server name, when it differs from the URL's host

    @model_validator(mode="after")
    def _pair(self) -> NatsTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("deploy.nats_tls: cert_file and key_file go together (mutual TLS)")
        return self


class DeployConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["single", "multi_gpu", "distributed"] = "single"
    # distributed: the workers expected (and, unless `partitions` says otherwise, one work partition each);
    # `kev cluster up` starts this many.
    workers: int = Field(1, ge=1)
    devices: tuple[str, ...] = ()  # multi_gpu: one engine replica per entry ("cuda:0", "cuda:1"; "cpu" for tests)
    # --- distributed: NATS JetStream ------------------------------------------------
    nats_url: str | None = None  # "nats://host:4222", or several servers of one cluster, comma-separated
    nats_user: str | None = None
    nats_password: str | None = None
    nats_token: str | None = None
    nats_creds_file: str | None = None  # a NATS .creds file (JWT + nkey seed), for operator-mode servers
    nats_tls: NatsTls | None = None
    # Every message between roles (work items, answers, deltas, request records) carries an HMAC-SHA256 tag with this
    # secret; one without it, or with a wrong one, is dropped and counted as a dead letter, never served.
    # `kev cluster up` makes one. None: no tags (the NATS users and permissions are the only check).
    cluster_secret: str | None = Field(None, min_length=32)
    subject_prefix: str = "kev"  # subjects, streams and buckets are named after it: two clusters can share NATS
    partitions: int | None = Field(None, ge=1, le=1024)  # work partitions the router hashes over; default `workers`
    # JetStream copies of every stream and bucket (3 on a 3-node NATS cluster)
    stream_replicas: int = Field(1, ge=1, le=5)
    ack_wait_s: float = Field(10.0, ge=0.5)  # a pulled question not acked (nor heartbeated) this long is redelivered
    max_deliver: int = Field(5, ge=1)  # deliveries of one question before JetStream gives up (its deadline answers it)
    # how long a question may wait in the stream before the aggregator times it out
    queue_timeout_ms: int = Field(60_000, ge=1)
    result_ttl_s: float = Field(3600.0, gt=0)  # how long answers and request records stay in the JetStream KV buckets
    heartbeat_s: float = Field(1.0, gt=0)  # worker status period; a worker silent for 3 periods counts as gone

    @property
    def num_partitions(self) -> int:
        return self.partitions or self.workers

    @model_validator(mode="after")
    def _consistent(self) -> DeployConfig:
        nats_keys = [k for k in ("nats_url", "nats_user", "nats_password", "nats_token", "nats_creds_file", "nats_tls")
                     if getattr(self, k) is not None]
        if self.mode == "distributed" and self.nats_url is None:
            raise ValueError("deploy.nats_url: mode 'distributed' needs the NATS server(s), e.g. nats://127.0.0.1:4222")
        if self.mode != "distributed" and nats_keys:
            raise ValueError(f"deploy.{nats_keys[0]}: only used by mode 'distributed' (mode is {self.mode!r})")
        if self.mode == "multi_gpu" and not self.devices:
            raise ValueError("deploy.devices: mode 'multi_gpu' needs one device per engine replica, "
                             "e.g. [cuda:0, cuda:1]")
        if self.mode != "multi_gpu" and self.devices:
            raise ValueError(f"deploy.devices: only used by mode 'multi_gpu' (mode is {self.mode!r})")
        for url in (self.nats_url or "").split(",") if self.nats_url else []:
            if not _URL.match(url.strip()):
                raise ValueError(f"deploy.nats_url: {url.strip()!r} is not a nats://, tls://, ws:// or wss:// URL")
        if (self.nats_user is None) != (self.nats_password is None):
            raise ValueError("deploy.nats_user: nats_user and nats_password go together")
        auths = [k for k in ("nats_user", "nats_token", "nats_creds_file") if getattr(self, k) is not None]
        if len(auths) > 1:
            raise ValueError(f"deploy.{auths[1]}: give one of nats_user/nats_password, nats_token or nats_creds_file")
        if not _PREFIX.match(self.subject_prefix):
            raise ValueError(f"deploy.subject_prefix: {self.subject_prefix!r} must be letters, digits, '_' or '-'")
        return self
