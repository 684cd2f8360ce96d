"""LocalCluster: `kev cluster up`: nats-server, one aggregator, N workers and one router on this machine.

Every child runs in its own session, so a Ctrl-C in the terminal reaches only the launcher,
which then stops them in order: the router (no new work), the workers (they finish or hand
back what they hold), the aggregator (it relays the last answers), NATS last. Until then it
supervises them (kev.distributed.supervisor): one that dies is reported at once and started
again after its back-off; status.json in the workdir says where each stands.
"""
from __future__ import annotations

import json
import logging
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kev.config import ConfigSource, load_config
from kev.distributed.bus_auth import RoleUser, new_users, nats_config, private_folder, write_private
from kev.distributed.nats_server import NatsServer
from kev.distributed.supervisor import ProcessState, write_status
from kev.errors import KevError
from kev.config.tenants import Tenants

log = logging.getLogger("kev.distributed")


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)  # `kev ...` arguments: what a restart runs again
    state: ProcessState = field(default_factory=lambda: ProcessState("", None))


@dataclass
class LocalCluster:
    config: ConfigSource
    num_workers: int
    workdir: Path
    host: str = "127.0.0.1"
    port: int = 8765
    nats_port: int = 0
    worker_threads: int | None = None
    nats: NatsServer | None = None
    children: list[Child] = field(default_factory=list)
    nats_state: ProcessState = field(default_factory=lambda: ProcessState("nats-server", None))
    _headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def up(self, timeout: float = 300.0) -> None:
        private_folder(self.workdir)  # keys, passwords and every tenant's key: the owner's alone
        private_folder(self.workdir / "nats")
        users, secret = new_users(), secrets.token_urlsafe(32)
        prefix = load_config(self.config).deploy.subject_prefix
        auth = self.workdir / "nats" / "users.conf"
        write_private(auth, nats_config(users, prefix))
        self.nats = NatsServer(self.workdir / "nats", self.nats_port, config_file=auth).start()
        self.nats_state = ProcessState("nats-server", self.nats.proc.pid if self.nats.proc else None)
        paths, api_key = self._write_configs(self.nats.url, users, secret)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._spawn("aggregator", ["aggregator", "--config", str(paths["aggregator"])])
        threads = ["--threads", str(self.worker_threads)] if self.worker_threads else []
        for i in range(self.num_workers):
            self._spawn(f"worker{i}", ["worker", "--config", str(paths["worker"]), "--partition", str(i), "--id",
                                       f"worker{i}", *threads])
        # its host and port are in the config (a flag may not contradict it)
        self._spawn("router", ["serve", "--config", str(paths["router"])])
        self.write_status()  # each process "starting" (loading a model takes a minute or two): status can say so
        self._wait_ready(timeout)
        self._mark_running({c.name for c in self.children})

    def _write_configs(self, nats_url: str, users: dict[str, RoleUser],
                       secret: str) -> tuple[dict[str, Path], str | None]:
        """One config per role (kev.yaml is the router's), each with that role's NATS user alone and the cluster
        secret that tags every message (deploy.cluster_secret); 0600."""
        paths, config = {}, None
        for role, user in users.items():
            config = load_config(self.config, {"deploy": {"mode": "distributed", "nats_url": nats_url,
                                                          "workers": self.num_workers, "devices": [],
                                                          "nats_user": f"kev-{role}", "nats_password": user.password,
                                                          "cluster_secret": secret},
                                               "server": {"host": self.host, "port": self.port}})
            paths[role] = self.workdir / ("kev.yaml" if role == "router" else f"kev-{role}.yaml")
            # JSON is YAML
            write_private(paths[role], json.dumps({"kev": config.model_dump(mode="json", exclude_none=True)}, indent=1))
        assert config is not None
        # the readiness probe reads /v1/channels (every worker's): the operator's key, or the lone tenant's
        return paths, Tenants.from_config(config.server).any_key()

    def _spawn(self, name: str, args: list[str]) -> None:
        proc = self._popen(name, args)
        self.children.append(Child(name, proc, self.workdir / f"{name}.log", args,
                                   ProcessState(name, proc.pid, state="starting")))

    def _popen(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as out:
            return subprocess.Popen([sys.executable, "-m", "kev.cli.main", *args], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def supervise(self) -> list[str]:
        """Report what died and start again what has waited out its back-off: one line per event."""
        now, events = time.time(), []
        for child in self.children:
            events += self._tend(child.state, child.proc.poll(), now, partial(self._restart_child, child))
        if self.nats is not None:
            code = self.nats.proc.poll() if self.nats.proc is not None else None
            events += self._tend(self.nats_state, code, now, self._restart_nats)
        if events:
            self.write_status()
        return events

    def _tend(self, state: ProcessState, code: int | None, now: float, restart: Callable[[], int]) -> list[str]:
        if state.state == "running" and code is not None:
            delay = state.died(code, now)
            return [f"{state.name} exited with {code}; restarting it in {delay:g} s"]
        if state.state == "restarting" and state.restart_at is not None and now >= state.restart_at:
            try:
                pid = restart()
            except KevError as err:  # it did not come up: back off further
                delay = state.died(None, now)
                return [f"{state.name} did not start ({err}); trying again in {delay:g} s"]
            state.restarted(pid, now)
            return [f"{state.name} restarted (pid {pid}; {state.restarts} restart(s) so far)"]
        return []

    def _restart_child(self, child: Child) -> int:
        child.proc = self._popen(child.name, child.args)
        return child.proc.pid

    def _restart_nats(self) -> int:
        assert self.nats is not None
        self.nats.start()  # the same port and storage: streams and buckets come back as they were
        assert self.nats.proc is not None
        return self.nats.proc.pid

    def write_status(self) -> None:
        write_status(self.workdir, [c.state for c in self.children] + [self.nats_state])

    def _wait_ready(self, timeout: float) -> None:
        """The router answers /readyz and every worker has sent a heartbeat."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if dead := self.exited():
                raise KevError(f"{dead[0].name} exited with {dead[0].proc.returncode}; see {dead[0].log_path}")
            try:
                request = urllib.request.Request(f"{self.url}/v1/channels", headers=self._headers)
                with urllib.request.urlopen(request, timeout=2) as response:  # 503 until the router is ready
                    workers = {c.get("worker") for c in json.load(response)["channels"]}
                self._mark_running({"router", *(str(w) for w in workers - {None})})
                if len(workers - {None}) >= self.num_workers:
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise KevError(f"cluster not ready after {timeout}s; logs in {self.workdir}")

    def _mark_running(self, names: set[str]) -> None:
        """Start-up: the router answered and these workers sent a heartbeat; status.json says so at once."""
        changed = [c for c in self.children if c.name in names and c.state.state == "starting"]
        now = time.time()
        for child in changed:
            child.state.state, child.state.ready_at = "running", now  # the record keeps when it stopped starting
        if changed:
            self.write_status()

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def down(self, grace: float = 30.0) -> list[int]:
        """Stop router, workers, aggregator (SIGTERM, then SIGKILL after `grace`), then NATS; their exit codes."""
        order = (["router"], [c.name for c in self.children if c.name.startswith("worker")], ["aggregator"])
        for names in order:
            group = [c for c in self.children if c.name in names]
            for child in group:
                if child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
            for child in group:
                try:
                    child.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within %ss; killing it", child.name, grace)
                    child.proc.kill()
                    child.proc.wait(10)
        if self.nats is not None:
            self.nats.stop()
        for state in [c.state for c in self.children] + [self.nats_state]:
            state.state, state.pid = "stopped", None
        self.write_status()
        return [c.proc.returncode for c in self.children]
