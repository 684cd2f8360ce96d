"""A real cluster for tests: nats-server on 127.0.0.1 (a free port), aggregator, workers and routers as processes.

Every process is the real CLI (`kev aggregator`, `kev worker`, `kev serve`) with a JSON
config file; each can be SIGKILLed and started again by name.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats

from kev.distributed.nats_server import NatsServer
from kev.distributed.subjects import Topology
from harness import ServerProcess, die_with_parent

REPO = Path(__file__).resolve().parents[2]
# Small and fast: one CPU thread per worker, short lease so a killed worker's questions come back soon.
BASE = {
    "router": {"strategy": "consistent_hash", "default_max_tokens": 8, "default_timeout_ms": 120_000},
    "core": {"threads": 1},
    "deploy": {"mode": "distributed", "workers": 2, "ack_wait_s": 3.0, "heartbeat_s": 0.5},
}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in extra.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


@dataclass
class Role:
    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    prefix: list[str] = field(default_factory=list)  # runs the role under it (`ip netns exec NS`)

    def start(self) -> Role:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "kev.cli.main", "-v", *self.args],
                                         cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent())
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


@dataclass
class Cluster:
    workdir: Path
    config: dict[str, Any] = field(default_factory=lambda: dict(BASE))
    nats: NatsServer | None = None
    roles: dict[str, Role] = field(default_factory=dict)
    routers: dict[str, ServerProcess] = field(default_factory=dict)

    def config_path(self, extra: dict[str, Any] | None = None, name: str = "kev") -> Path:
        assert self.nats is not None
        config = merged(merged(self.config, {"deploy": {"nats_url": self.nats.url}}), extra or {})
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps({"kev": config}))
        return path

    def start_nats(self) -> Cluster:
        self.nats = (self.nats or NatsServer(self.workdir / "nats")).start()
        return self

    def start_aggregator(self) -> Role:
        return self._start("aggregator", ["aggregator", "--config", str(self.config_path())])

    def start_worker(self, partition: int, name: str | None = None) -> Role:
        name = name or f"worker{partition}"
        return self._start(name, ["worker", "--config", str(self.config_path()), "--partition", str(partition),
                                  "--id", name, "--grace", "5"])

    def start_router(self, name: str = "router", extra: dict[str, Any] | None = None) -> ServerProcess:
        """`kev serve` on a free port; ready once it is connected to NATS."""
        config = merged(merged(self.config, {"deploy": {"nats_url": self.nats.url}}), extra or {})  # type: ignore[union-attr]
        router = ServerProcess(config, self.workdir / name).start(timeout=600)
        self.routers[name] = router
        return router

    def _start(self, name: str, args: list[str]) -> Role:
        role = self.roles[name] = Role(name, args, self.workdir / f"{name}.log").start()
        return role

    def wait_workers(self, client: httpx.Client, names: set[str], timeout: float = 600.0) -> None:
        """Until the router hears every named worker's heartbeat (their models are loaded then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = {c.get("worker") for c in client.get("/v1/channels").json()["channels"]}
            if names <= seen:
                return
            for name in names:
                role = self.roles.get(name)
                if role is not None and role.proc is not None and role.proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {role.proc.returncode}:\n{role.log()[-3000:]}")
            time.sleep(0.3)
        raise RuntimeError(f"workers {names} not heard within {timeout}s")

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for name, router in self.routers.items():
            router.terminate()
            codes[name] = router.proc.returncode if router.proc else None
        for name, role in self.roles.items():
            if name != "aggregator":
                codes[name] = role.terminate()
        if "aggregator" in self.roles:
            codes["aggregator"] = self.roles["aggregator"].terminate()
        if self.nats is not None:
            self.nats.stop()
        return codes

    def answers_waiting(self, request_id: str) -> int:
        """Answers the workers published for a request into the results stream (JetStream keeps them there until
        an aggregator takes them, and after)."""
        assert self.nats is not None
        topology = Topology("kev", self.config["deploy"]["workers"])
        subject = topology.result_subject(request_id)

        async def count() -> int:
            connection = await nats.connect(self.nats.url)  # type: ignore[union-attr]
            try:
                info = await connection.jetstream().stream_info(topology.results_stream, subjects_filter=subject)
                return (info.state.subjects or {}).get(subject, 0)
            finally:
                await connection.close()

        return asyncio.run(count())

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{r.log()[-2000:]}" for n, r in self.roles.items())


@contextmanager
def two_worker_cluster(folder: Path) -> Iterator[Cluster]:
    """nats-server, aggregator, worker0, worker1 and a router, all serving; every role must stop cleanly after."""
    cluster = Cluster(folder, dict(BASE)).start_nats()
    try:
        cluster.start_aggregator()
        cluster.start_worker(0)
        cluster.start_worker(1)
        router = cluster.start_router()
        with httpx.Client(base_url=router.url, timeout=300) as client:
            cluster.wait_workers(client, {"worker0", "worker1"})
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), f"a role did not stop cleanly: {codes}\n{cluster.logs()}"
