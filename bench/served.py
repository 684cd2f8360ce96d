"""What the bench scripts that drive a real `kev serve` share: starting it from this checkout, a free port, and the
machine line every result records."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, folder: Path, args: tuple[str, ...] = (),
                 env_drop: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """`kev serve` of this checkout (the default config unless args name one), once /health says ready (up to
    900 s)."""
    log = (folder / "server.log").open("wb")
    env = {key: value for key, value in {**os.environ, "PYTHONPATH": str(REPO)}.items() if key not in env_drop}
    proc = subprocess.Popen([sys.executable, "-m", "kev.cli.main", "serve", "--port", str(port), *args], cwd=REPO,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kev serve exited with {proc.returncode}; see {folder / 'server.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("kev serve was not ready within 900 s")


def machine() -> str:
    """The processor (model and family), CPUs, memory and the load average now."""
    info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    model = f"{info.get('model name', platform.processor())} (cpu family {info.get('cpu family', '?')})"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"{model}, {os.cpu_count()} CPUs, {memory:.0f} GiB; load average {load}"
