"""`kev batch` on a cluster (`kev cluster up --workers 2`): the job feeds the JetStream work queue, both workers
share it, and a worker SIGKILLed mid-job loses and duplicates nothing; answers equal a single-mode run."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kev.distributed.nats_server import free_port
from tests.batch.batch_files import (REPO, answers, batch_command, config_file, env, job_lines, read_output,
                                     run_batch, write_jsonl)

pytestmark = [pytest.mark.slow, pytest.mark.service]
NUM_LINES = 48


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """`kev cluster up --workers 2`; yields its work folder (kev.yaml is there) and the launcher."""
    folder = tmp_path_factory.mktemp("kev-batch-cluster")
    log = (folder / "launcher.log").open("wb")
    launcher = subprocess.Popen([sys.executable, "-m", "kev.cli.main", "cluster", "up", "--workers", "2",
                                 "--threads", "1", "--port", str(free_port()), "--config", str(config_file(folder)),
                                 "--workdir", str(folder / "run")],
                                cwd=REPO, env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "Ctrl-C to stop" not in (folder / "launcher.log").read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, (folder / "launcher.log").read_text()
            time.sleep(0.3)
        yield folder / "run", launcher
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(120)
        finally:
            if launcher.poll() is None:
                launcher.kill()


def worker(launcher: subprocess.Popen[bytes], name: str) -> psutil.Process:
    return next(c for c in psutil.Process(launcher.pid).children() if name in c.cmdline())


def test_a_job_on_the_cluster_survives_a_killed_worker(cluster, tmp_path: Path) -> None:
    run_dir, launcher = cluster
    lines = job_lines(NUM_LINES, max_tokens=lambda i: 12)
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    reference = run_batch(source, "-o", tmp_path / "single.jsonl", "--config", config_file(tmp_path), "--threads", "1",
                          "--quiet")
    assert reference.returncode == 0, reference.stderr
    expected = {r["custom_id"]: answers(r) for r in read_output(tmp_path / "single.jsonl")}

    out = tmp_path / "cluster.jsonl"
    job = subprocess.Popen(batch_command(source, "-o", out, "--config", run_dir / "kev.yaml", "--quiet",
                                         "--json-summary", tmp_path / "summary.json"),
                           cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not out.exists() or out.read_bytes().count(b"\n") < 4:
        assert job.poll() is None and time.monotonic() < deadline, job.stderr.read() if job.stderr else ""
        time.sleep(0.05)
    worker(launcher, "worker1").send_signal(signal.SIGKILL)  # mid-job: it holds pulled, unanswered questions
    _, stderr = job.communicate(timeout=900)
    assert job.returncode == 0, stderr
    records = read_output(out)
    ids = [r["custom_id"] for r in records]
    assert len(ids) == NUM_LINES and set(ids) == set(expected), "every request exactly once"
    for record in records:
        assert answers(record) == expected[record["custom_id"]], record["custom_id"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["ok"], summary["failed"]) == (NUM_LINES, 0)
