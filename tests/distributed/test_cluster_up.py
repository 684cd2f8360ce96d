"""`kev cluster up`: nats-server, aggregator, a worker and a router from one command; SIGINT stops them all, exit 0."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from harness import wait_until

from kev.distributed.nats_server import free_port
from tests.distributed.cluster_harness import REPO

pytestmark = pytest.mark.service


def test_cluster_up_answers_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    config = tmp_path / "kev.json"
    config.write_text(json.dumps({"kev": {"router": {"default_max_tokens": 4}}}))
    port = free_port()
    log = (tmp_path / "launcher.log").open("wb")
    launcher = subprocess.Popen([sys.executable, "-m", "kev.cli.main", "cluster", "up", "--workers", "1", "--port",
                                 str(port), "--threads", "1", "--config", str(config),
                                 "--workdir", str(tmp_path / "run")],
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: (tmp_path / "run" / "status.json").exists(), 240)  # written as the processes start
        status = subprocess.run([sys.executable, "-m", "kev.cli.main", "cluster", "status", "--workdir",
                                 str(tmp_path / "run")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                capture_output=True, text=True, timeout=120)
        # "starting" while the models load, "running" once they have (a cached kernel build and a quiet machine
        # can be that quick): either way every process is listed
        states = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[1:] if line.strip()}
        assert status.returncode == 0 and set(states.values()) <= {"starting", "running"} and set(states) == {
            "aggregator", "worker0", "router", "nats-server"}, status
        if "starting" not in states.values():  # loaded before the status ran: the record says when each left it
            # (the table while they start: test_units' cluster status test)
            processes = json.loads((tmp_path / "run" / "status.json").read_text())["processes"]
            assert all(p["ready_at"] for p in processes if p["name"] != "nats-server"), processes
        deadline = time.monotonic() + 240
        while "Ctrl-C to stop" not in (tmp_path / "launcher.log").read_text() and time.monotonic() < deadline:
            assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()
            time.sleep(0.3)
        children = psutil.Process(launcher.pid).children()
        names = sorted(c.name() if c.name() == "nats-server" else c.cmdline()[3] for c in children)
        assert names == ["aggregator", "nats-server", "serve", "worker"], names
        run = tmp_path / "run"
        assert stat.S_IMODE(run.stat().st_mode) == 0o700, "the workdir holds every key: the owner's alone"
        for secret in ("kev.yaml", "kev-worker.yaml", "kev-aggregator.yaml", "nats/users.conf"):
            assert stat.S_IMODE((run / secret).stat().st_mode) == 0o600, secret
        response = httpx.post(f"http://127.0.0.1:{port}/v1/query", json={"queries": ["Say hi."]}, timeout=120)
        assert response.status_code == 200 and response.json()["results"][0]["status"] == "ok"
        worker_restarts_after_a_kill(tmp_path, port, next(c for c in children if "worker" in c.cmdline()))
        children = psutil.Process(launcher.pid).children()  # the restarted worker among them
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(120) == 0, (tmp_path / "launcher.log").read_text()
        assert "exit codes [0, 0, 0]" in (tmp_path / "launcher.log").read_text()
        assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    finally:
        if launcher.poll() is None:  # a failure above: its children run in sessions of their own, so they go too
            orphans = psutil.Process(launcher.pid).children()
            launcher.kill()
            for child in orphans:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass


def worker_restarts_after_a_kill(tmp_path: Path, port: int, worker: psutil.Process) -> None:
    """Issue 24: a worker that dies is reported at once (console and /health's detail), restarted with back-off,
    and `kev cluster status` lists its restart."""
    worker.kill()
    log = tmp_path / "launcher.log"
    wait_until(lambda: "worker0 exited with -9; restarting it in 1 s" in log.read_text(), 300)
    health = f"http://127.0.0.1:{port}/health"
    gone = wait_until(lambda: "worker0" in (httpx.get(health, timeout=30).json().get("detail") or ""), 120)
    assert gone
    wait_until(lambda: "worker0 restarted" in log.read_text(), 300)
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json().get("detail") is None, 300)
    answered = httpx.post(f"http://127.0.0.1:{port}/v1/query", json={"queries": ["Say hi."]}, timeout=300)
    assert answered.status_code == 200 and answered.json()["results"][0]["status"] == "ok"
    status = subprocess.run([sys.executable, "-m", "kev.cli.main", "cluster", "status", "--workdir",
                             str(tmp_path / "run")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    row = next(line.split() for line in status.stdout.splitlines() if line.startswith("worker0"))
    assert row[1] == "running" and row[3] == "1" and row[4] == "-9", status.stdout
