"""Test harness: a real `kev serve` in a subprocess on 127.0.0.1, and readers for its SSE and metrics."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]


def die_with_parent() -> Callable[[], None] | None:
    """A Popen preexec_fn: the child gets SIGKILL when the test process dies (Linux's PR_SET_PDEATHSIG), so a suite
    killed mid-way (a CI timeout, the OOM killer) leaves no server or worker behind holding memory and ports. Only
    from the main thread: the signal follows the thread that started the child, not the process."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None

    def arm() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    return arm
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@dataclass
class ServerProcess:
    config: dict[str, Any]
    workdir: Path
    api_key: str | None = None
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    prefix: list[str] = field(default_factory=list)  # runs the server under it (`ip netns exec NS`)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def start(self, timeout: float = 600.0, ready: bool = True) -> ServerProcess:
        """Port 0 lets the OS pick a free port; we read the real one from uvicorn's log line.

        ready=False returns as soon as the server listens, while its model may still load."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "kev.yaml"
        # Uploaded files and batches stay in the test's folder unless the test names a batch.dir.
        config = {**self.config, "batch": {"dir": str(self.workdir / "batches"), **self.config.get("batch", {})}}
        config_path.write_text(json.dumps({"kev": config}))  # JSON is YAML
        args = [*self.prefix, sys.executable, "-m", "kev.cli.main", "serve", "--config", str(config_path),
                "--port", "0", *(["--api-key", self.api_key] if self.api_key else []), *self.extra_args]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("KEV_API_KEY", None)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kev serve exited with {self.proc.returncode}:\n{self.log()}")
            if not self.port and (match := _LISTENING.search(self.log())):
                self.port = int(match.group(1))
            if self.port and (not ready or self._is_ready()):
                return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"kev serve not ready after {timeout}s:\n{self.log()}")

    def _is_ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", headers=self.headers, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def peak_rss_mib(self) -> float:
        """The kernel's high-water mark of the server's resident memory."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait: the exit code of a graceful shutdown (0)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_until(predicate: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    """Poll predicate until it returns something truthy (returned); a generous deadline, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s")


def busy_channels(server: ServerProcess) -> int:
    """Channels holding a question now (GET /v1/channels)."""
    channels = httpx.get(f"{server.url}/v1/channels", headers=server.headers, timeout=30).json()["channels"]
    return sum(c["state"] != "idle" for c in channels)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_text = head.partition("{")
        if metric_name != name:
            continue
        if all(f'{key}="{val}"' in label_text for key, val in labels.items()):
            total += float(value)
    return total


def read_sse(lines: Iterable[str]) -> list[tuple[str | None, Any]]:
    """(event, data) per Server-Sent Event; data is parsed JSON, or the raw string ('[DONE]')."""
    events: list[tuple[str | None, Any]] = []
    event: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            raw = "\n".join(data)
            events.append((event, raw if raw == "[DONE]" else json.loads(raw)))
            event, data = None, []
    return events
