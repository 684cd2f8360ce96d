"""What `kev cluster up` does when a process it started dies: say so at once, restart it with back-off, count it.

Restart delays double from FIRST_DELAY_S up to MAX_DELAY_S; a process that then stays up for
STABLE_S is forgiven (its next death waits FIRST_DELAY_S again). The launcher writes every
process's state to status.json in its workdir whenever it changes: `kev cluster status` reads it.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
STABLE_S = 60.0
STATUS_FILE = "status.json"


@dataclass
class ProcessState:
    """One supervised process, as `kev cluster status` lists it."""

    name: str
    pid: int | None
    state: str = "running"  # starting (cluster up waits for it) / running / restarting (its back-off) / stopped
    restarts: int = 0  # since `kev cluster up`
    streak: int = 0  # deaths in a row without STABLE_S up between them: the back-off's exponent
    last_exit: int | None = None
    started_at: float = field(default_factory=time.time)
    restart_at: float | None = None  # unix seconds; set while restarting
    ready_at: float | None = None  # unix seconds: when `cluster up` saw it ready and it left "starting"

    def died(self, code: int | None, now: float) -> float:
        """Record its death; the delay before it is started again."""
        if now - self.started_at >= STABLE_S:
            self.streak = 0  # it had been up long enough: a fresh fault, not a crash loop
        delay = min(MAX_DELAY_S, FIRST_DELAY_S * 2**self.streak)
        self.streak += 1
        self.state, self.last_exit, self.pid, self.restart_at = "restarting", code, None, now + delay
        return delay

    def restarted(self, pid: int, now: float) -> None:
        self.state, self.pid, self.started_at, self.restart_at = "running", pid, now, None
        self.restarts += 1


def write_status(workdir: Path, states: list[ProcessState]) -> None:
    path = workdir / STATUS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"updated_at": time.time(), "processes": [asdict(s) for s in states]}, indent=1))
    tmp.replace(path)  # a reader never sees half a file


def read_status(workdir: Path) -> list[ProcessState]:
    data = json.loads((workdir / STATUS_FILE).read_text())
    return [ProcessState(**p) for p in data["processes"]]


def status_table(states: list[ProcessState]) -> str:
    rows = [f"{'process':<12} {'state':<11} {'pid':>8} {'restarts':>8} {'last exit':>9}"]
    for s in states:
        pid = "-" if s.pid is None else str(s.pid)
        last = "-" if s.last_exit is None else str(s.last_exit)
        rows.append(f"{s.name:<12} {s.state:<11} {pid:>8} {s.restarts:>8} {last:>9}")
    return "\n".join(rows)
