"""Helpers of the batch tests: a job file, running `kev batch` as a user does, reading its output."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
TOPICS = ("the sea", "a cat", "mountains", "rain", "coffee", "trains", "the moon", "a garden", "music", "winter")
# Generous deadlines: CI machines are slow and shared; timeouts have their own tests.
CONFIG = {"router": {"default_timeout_ms": 600_000}}


def job_lines(count: int, max_tokens: Any = lambda i: 4 + i % 5) -> list[dict[str, Any]]:
    """OpenAI Batch lines, chat and completions alternating, greedy, short answers of varied length."""
    lines = []
    for i in range(count):
        if i % 2 == 0:
            content = f"Write one line about {TOPICS[i % 10]} (#{i})."
            url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}
        else:
            url, body = "/v1/completions", {"prompt": f"Fact {i} about {TOPICS[i % 10]}:"}
        body.update(model=MODEL, max_tokens=max_tokens(i), temperature=0)
        lines.append({"custom_id": f"req-{i:03d}", "method": "POST", "url": url, "body": body})
    return lines


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config_file(folder: Path, extra: dict[str, Any] | None = None) -> Path:
    path = folder / "kev.json"
    path.write_text(json.dumps({"kev": {**CONFIG, **(extra or {})}}))  # JSON is YAML
    return path


def batch_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "kev.cli.main", "batch", *map(str, args)]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_batch(*args: str | Path, stdin: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(batch_command(*args), cwd=REPO, env=env(), input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def read_output(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def answers(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, finish_reason) of every choice of a 200 line, chat or completion."""
    body = record["response"]["body"]
    return [(c["message"]["content"] if "message" in c else c["text"], c["finish_reason"]) for c in body["choices"]]
