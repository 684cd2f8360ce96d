"""OpenAI's Files and Batches API on `kev serve`, driven by the official `openai` client: a round trip, cancel,
an invalid file, limits and auth, and a server SIGKILLed mid-batch that resumes it after a restart."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from harness import ServerProcess

from tests.batch.batch_files import CONFIG, answers, job_lines, write_jsonl

pytestmark = pytest.mark.service
KEY = "sk-kev-batch"
MAX_FILE_BYTES = 40_000


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    folder = tmp_path_factory.mktemp("kev-batches")
    return start_server({**CONFIG, "batch": {"dir": str(folder), "max_file_bytes": MAX_FILE_BYTES}}, api_key=KEY)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        yield client


def upload(client: openai.OpenAI, folder: Path, rows: list[dict[str, Any]], name: str = "in.jsonl") -> str:
    path = write_jsonl(folder / name, rows)
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="batch").id


def wait_for(client: openai.OpenAI, batch_id: str, done: Callable[[Any], bool], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while not done(batch := client.batches.retrieve(batch_id)):
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}: {batch.request_counts}"
        time.sleep(0.2)
    return batch


def finished(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


def output_lines(client: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def alone(client: openai.OpenAI, line: dict[str, Any]) -> list[tuple[str, str]]:
    body = dict(line["body"])
    create = client.chat.completions.create if line["url"] == "/v1/chat/completions" else client.completions.create
    return answers({"response": {"body": create(**body).model_dump()}})


def test_files_and_batches_round_trip_with_the_official_client(client: openai.OpenAI, tmp_path: Path) -> None:
    rows = job_lines(8)
    chat = [r for r in rows if r["url"] == "/v1/chat/completions"]
    file_id = upload(client, tmp_path, chat)
    assert client.files.retrieve(file_id).purpose == "batch" and file_id in [f.id for f in client.files.list()]
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"eval": "smoke"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"eval": "smoke"}
    batch = wait_for(client, batch.id, finished)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (4, 4, 0)
    assert batch.output_file_id and batch.error_file_id is None and batch.completed_at and batch.in_progress_at
    lines = output_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in lines) == [r["custom_id"] for r in chat]
    for row in chat:
        line = next(line for line in lines if line["custom_id"] == row["custom_id"])
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert answers(line) == alone(client, row), row["custom_id"]
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"


def test_cancel_stops_a_batch_and_keeps_what_finished(client: openai.OpenAI, tmp_path: Path) -> None:
    rows = [r for r in job_lines(120, max_tokens=lambda i: 24) if r["url"] == "/v1/completions"]
    file_id = upload(client, tmp_path, rows)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
    wait_for(client, batch.id, lambda b: b.request_counts.completed >= 1 or finished(b))
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = wait_for(client, batch.id, finished)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert 1 <= batch.request_counts.completed < len(rows), batch.request_counts
    lines = output_lines(client, batch.output_file_id)
    assert len(lines) == batch.request_counts.completed
    assert all(line["response"]["status_code"] == 200 for line in lines), "nothing cut short was written"
    assert client.batches.cancel(batch.id).status == "cancelled", "cancelling a finished batch changes nothing"


def test_an_invalid_input_file_fails_the_batch_naming_line_and_field(client: openai.OpenAI, tmp_path: Path) -> None:
    rows = job_lines(2)
    rows[1] = {**rows[1], "url": "/v1/chat/completions"}  # a completions body sent to the chat endpoint
    file_id = upload(client, tmp_path, rows)
    batch = wait_for(client, client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                   completion_window="24h").id, finished)
    assert batch.status == "failed" and batch.failed_at and batch.request_counts.completed == 0
    [error] = batch.errors.data
    assert error.line == 2 and error.param == "body.messages" and "line 2" in error.message


def test_limits_auth_and_unknown_ids(server: ServerProcess, client: openai.OpenAI, tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    big.write_text("x" * (MAX_FILE_BYTES + 1))
    with big.open("rb") as f, pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=f, purpose="batch")
    assert refused.value.status_code == 413 and f"batch.max_file_bytes={MAX_FILE_BYTES}" in refused.value.message
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_" + "0" * 24)
    with pytest.raises(openai.NotFoundError, match="input_file_id"):
        client.batches.create(input_file_id="file-" + "0" * 24, endpoint="/v1/completions", completion_window="24h")
    file_id = upload(client, tmp_path, job_lines(1))
    with pytest.raises(openai.UnprocessableEntityError, match="endpoint"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")  # type: ignore[arg-type]
    for path in ("/v1/files", "/v1/batches"):
        assert httpx.get(server.url + path).status_code == 401
    assert client.files.delete(file_id).deleted and file_id not in [f.id for f in client.files.list()]


def test_a_server_killed_mid_batch_resumes_it_after_restart(tmp_path: Path) -> None:
    config = {**CONFIG, "batch": {"dir": str(tmp_path / "state")}}
    rows = [r for r in job_lines(60, max_tokens=lambda i: 6) if r["url"] == "/v1/completions"]
    first = ServerProcess(config, tmp_path / "first").start()
    try:
        with openai.OpenAI(base_url=f"{first.url}/v1", api_key="none", max_retries=0, timeout=600) as client:
            file_id = upload(client, tmp_path, rows)
            batch_id = client.batches.create(input_file_id=file_id, endpoint="/v1/completions",
                                             completion_window="24h").id
            wait_for(client, batch_id, lambda b: b.request_counts.completed >= 5 or finished(b))
    finally:
        first.kill()  # SIGKILL, mid-batch
    left = json.loads((tmp_path / "state" / "batches" / f"{batch_id}.json").read_text())
    assert left["status"] == "in_progress" and left["request_counts"]["completed"] < len(rows), left
    second = ServerProcess(config, tmp_path / "second").start()
    try:
        with openai.OpenAI(base_url=f"{second.url}/v1", api_key="none", max_retries=0, timeout=600) as client:
            batch = wait_for(client, batch_id, finished)
            assert batch.status == "completed" and batch.request_counts.completed == len(rows), batch
            lines = output_lines(client, batch.output_file_id)
            ids = [line["custom_id"] for line in lines]
            assert sorted(ids) == [r["custom_id"] for r in rows], "each request exactly once"
            for row in rows:
                line = next(line for line in lines if line["custom_id"] == row["custom_id"])
                assert answers(line) == alone(client, row), row["custom_id"]
    finally:
        assert second.terminate() == 0
