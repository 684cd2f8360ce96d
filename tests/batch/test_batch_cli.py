"""`kev batch` as a user runs it: 200 requests equal to each answered alone, a SIGKILL halfway and a resume,
a torn last line, --ordered, Ctrl-C, bad input refused before compute, stdin to stdout."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.batch.batch_files import (CONFIG, REPO, answers, batch_command, config_file, env, job_lines, read_output,
                                     run_batch, write_jsonl)

pytestmark = [pytest.mark.slow, pytest.mark.service]
NUM_LINES = 200


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kev-batch")


@pytest.fixture(scope="module")
def job(folder: Path) -> tuple[Path, Path, list[dict[str, Any]]]:
    lines = job_lines(NUM_LINES)
    return write_jsonl(folder / "in.jsonl", lines), config_file(folder), lines


@pytest.fixture(scope="module")
def full_run(job, folder: Path) -> dict[str, dict[str, Any]]:
    """One uninterrupted run of the 200-line job: custom_id -> output line."""
    source, config, _ = job
    out = folder / "full.jsonl"
    done = run_batch(source, "-o", out, "--config", config, "--json-summary", folder / "full.json")
    assert done.returncode == 0, done.stderr
    assert "done: 200/200 requests, 200 ok, 0 failed" in done.stderr, done.stderr
    records = read_output(out)
    assert len(records) == NUM_LINES
    return {r["custom_id"]: r for r in records}


def test_a_200_line_job_equals_each_request_answered_alone(job, full_run, start_server) -> None:
    _, _, lines = job
    server = start_server(CONFIG)
    summary = json.loads((job[0].parent / "full.json").read_text())
    assert (summary["requests"], summary["ok"], summary["failed"]) == (200, 200, 0)
    with httpx.Client(base_url=server.url, timeout=300) as client:
        for line in lines:
            record = full_run[line["custom_id"]]
            assert record["error"] is None and record["response"]["status_code"] == 200
            assert record["id"].startswith("batch_req_")
            alone = client.post(line["url"], json=line["body"])
            assert alone.status_code == 200, alone.text
            body = record["response"]["body"]
            assert body["object"] == alone.json()["object"]
            assert answers(record) == answers({"response": {"body": alone.json()}}), line["custom_id"]
            assert body["usage"] == alone.json()["usage"], line["custom_id"]
    completion_tokens = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in full_run.values())
    assert completion_tokens == summary["completion_tokens"]


def test_sigkill_halfway_then_resume_answers_each_request_once_and_unchanged(job, full_run, folder: Path) -> None:
    source, config, _ = job
    out = folder / "killed.jsonl"
    args = (source, "-o", out, "--config", config, "--quiet")
    proc = subprocess.Popen(batch_command(*args), cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 900
    while not out.exists() or out.read_bytes().count(b"\n") < NUM_LINES // 2:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the job did not get halfway"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    killed_at = out.read_bytes().count(b"\n")
    assert NUM_LINES // 2 <= killed_at < NUM_LINES, "killed halfway, not at the end"
    resumed = run_batch(*args[:-1], "--json-summary", folder / "resumed.json")
    assert resumed.returncode == 0, resumed.stderr
    records = read_output(out)
    ids = [r["custom_id"] for r in records]
    assert len(ids) == NUM_LINES and len(set(ids)) == NUM_LINES, "each custom_id exactly once"
    assert json.loads((folder / "resumed.json").read_text())["resumed"] >= killed_at
    for record in records:
        assert answers(record) == answers(full_run[record["custom_id"]]), record["custom_id"]


def test_a_torn_last_line_is_cut_off_and_redone(job, full_run, folder: Path) -> None:
    source, config, _ = job
    out = folder / "torn.jsonl"
    kept = list(full_run.values())[:-2]
    torn = json.dumps(list(full_run.values())[-2])
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + torn[: len(torn) // 2])
    done = run_batch(source, "-o", out, "--config", config, "--json-summary", folder / "torn.json")
    assert done.returncode == 0, done.stderr
    assert "cut off a torn last line" in done.stderr
    records = read_output(out)  # every line parses: the torn one is gone
    assert sorted(r["custom_id"] for r in records) == sorted(full_run)
    assert json.loads((folder / "torn.json").read_text())["resumed"] == NUM_LINES - 2
    for record in records[-2:]:
        assert answers(record) == answers(full_run[record["custom_id"]])


def test_ordered_writes_in_input_order_though_later_lines_finish_first(folder: Path) -> None:
    lines = job_lines(12, max_tokens=lambda i: 26 - 2 * i)  # the first line is the longest
    source = write_jsonl(folder / "ordered.jsonl", lines)
    config = config_file(folder)
    for ordered, out in ((True, folder / "ordered.out"), (False, folder / "unordered.out")):
        done = run_batch(source, "-o", out, "--config", config, "--max-inflight", "12",
                         *(["--ordered"] if ordered else []))
        assert done.returncode == 0, done.stderr
    assert [r["custom_id"] for r in read_output(folder / "ordered.out")] == [line["custom_id"] for line in lines]
    finished = [r["custom_id"] for r in read_output(folder / "unordered.out")]
    assert sorted(finished) == sorted(line["custom_id"] for line in lines)
    assert finished != [line["custom_id"] for line in lines], "completion order: short answers come out first"


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(folder: Path) -> None:
    source = write_jsonl(folder / "ctrl_c.jsonl", job_lines(40))
    out, config = folder / "ctrl_c.out", config_file(folder)
    proc = subprocess.Popen(batch_command(source, "-o", out, "--config", config), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not out.exists() or not out.read_bytes().count(b"\n"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Resume with the same command" in stderr and "kev batch" in stderr
    written = read_output(out)
    assert 1 <= len(written) < 40, "stopped half-way"
    assert all(r["response"]["status_code"] == 200 for r in written), "no cancelled line written"
    again = run_batch(source, "-o", out, "--config", config)
    assert again.returncode == 0, again.stderr
    assert sorted(r["custom_id"] for r in read_output(out)) == [f"req-{i:03d}" for i in range(40)]


def test_bad_lines_are_refused_before_compute_or_written_as_errors(folder: Path) -> None:
    good = job_lines(2)
    rows = [json.dumps(good[0]), json.dumps(good[1]), json.dumps(good[0]), '{"custom_id": "x", "method": "POST"',
            json.dumps({**good[1], "custom_id": "y", "body": {**good[1]["body"], "top_p": 2}})]
    source = folder / "bad.jsonl"
    source.write_text("\n".join(rows) + "\n")
    out, config = folder / "bad.out", config_file(folder)
    refused = run_batch(source, "-o", out, "--config", config)
    assert refused.returncode == 2 and not out.exists()
    assert "line 3: custom_id: 'req-000' is a duplicate (first on line 1)" in refused.stderr
    assert "line 4: not valid JSON" in refused.stderr
    assert "line 5: body.top_p:" in refused.stderr
    skipped = run_batch(source, "-o", out, "--config", config, "--skip-invalid")
    assert skipped.returncode == 1, skipped.stderr  # some lines failed: their error lines are in the output
    records = read_output(out)
    assert len(records) == 5
    by_id = {r["custom_id"]: r for r in records}
    assert by_id["req-000"]["response"]["status_code"] == 200 and by_id["req-001"]["response"]["status_code"] == 200
    assert by_id["y"]["response"]["status_code"] == 422  # what the live route answers for that body
    assert by_id["y"]["response"]["body"]["error"]["param"] == "top_p"
    unreadable = {r["error"]["line"]: r["error"]["message"] for r in records if r["custom_id"] is None}
    assert sorted(unreadable) == [3, 4] and "duplicate" in unreadable[3] and "not valid JSON" in unreadable[4]
    assert run_batch(source, "-o", out, "--config", config, "--skip-invalid").returncode == 1
    assert len(read_output(out)) == 5, "a resumed run writes no line twice"


def test_stdin_to_stdout_with_a_txt_job() -> None:
    done = run_batch("-", "-o", "-", "--format", "txt", "--max-tokens", "3", "--temperature", "0", "--quiet",
                     stdin="What is 2+2?\n\nName a fruit.\n")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["custom_id"] for r in records) == ["1", "3"]
    assert all(r["response"]["body"]["object"] == "chat.completion" for r in records)
    assert all(r["response"]["body"]["usage"]["completion_tokens"] <= 3 for r in records)
