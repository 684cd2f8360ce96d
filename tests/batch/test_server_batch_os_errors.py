"""`kev serve`'s batches (/v1/batches) meet a full disk as one line naming the file and what to do: the batch fails
with that message, what it answered stays readable, no traceback in the log. The app runs in process (the default
model's engine), so the refusal can be raised where the output is written (the tests run as root: no real full disk)."""
from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import kev
from kev.batch import output_file
from kev.server.app import build_app
from tests.batch.batch_files import CONFIG, job_lines, write_jsonl

pytestmark = pytest.mark.slow


def wait_for_batch(client: TestClient, batch_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (batch := client.get(f"/v1/batches/{batch_id}").json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, str(batch)
        time.sleep(0.1)
    return batch


def test_a_full_disk_fails_the_batch_with_one_line_and_keeps_what_it_answered(
        tmp_path: Path, default_model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from kev.engine.engine_setup import build_parts

    model, tokenizer = default_model
    config = kev.load_config({**CONFIG, "core": {"precision": "fp32"}, "batch": {"dir": str(tmp_path / "batches")}})
    real_write, outputs = os.write, []

    def fill_up(fd: int, data: bytes) -> int:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if not target.endswith(".data") or "/files/" not in target:  # a batch's output file: the 3rd line fills it
            return real_write(fd, data)
        outputs.append(target)
        if len(outputs) == 3:
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(output_file.os, "write", fill_up)
    app = build_app(config, engine_factory=lambda c: kev.Engine(c, build_parts(c, model, tokenizer)))
    with caplog.at_level(logging.INFO, logger="kev"), TestClient(app) as client:
        rows = [row for row in job_lines(12, max_tokens=lambda i: 3) if row["url"] == "/v1/completions"]
        source = write_jsonl(tmp_path / "in.jsonl", rows)
        with source.open("rb") as f:
            file_id = client.post("/v1/files", data={"purpose": "batch"}, files={"file": f}).json()["id"]
        created = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                   "completion_window": "24h"})
        assert created.status_code == 200, created.text
        batch = wait_for_batch(client, created.json()["id"])
        assert batch["status"] == "failed", batch
        [error] = batch["errors"]["data"]
        assert "no space left on the device" in error["message"] and outputs[-1] in error["message"], error
        assert batch["request_counts"]["completed"] == 2, batch  # the two whole lines; the torn one was cut off
        kept = client.get(f"/v1/files/{batch['output_file_id']}/content")
        lines = [json.loads(line) for line in kept.text.splitlines()]
        assert len(lines) == 2 and kept.text.endswith("\n")
        assert {line["custom_id"] for line in lines} <= {row["custom_id"] for row in rows}
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.exc_info for r in failures] == [None], [r.getMessage() for r in failures]  # one line, no traceback
    assert "no space left on the device" in failures[0].getMessage()
