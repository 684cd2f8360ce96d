"""Progress when stderr is not a terminal (a CI log, a file): plain lines every few seconds or 10%, as pip and tqdm
print there, for `kev batch` and the commands with a bar (`kev run`)."""
from __future__ import annotations

import io
import re

import pytest

from kev.cli.progress_lines import ProgressLines
from tests.batch.batch_files import config_file, job_lines, run_batch, write_jsonl


def test_a_line_at_the_start_at_every_tenth_and_at_the_end() -> None:
    out = io.StringIO()
    lines = ProgressLines("job", out, interval_s=1e9)  # only the percent rule can fire
    for done in range(101):
        lines.update(done, 100, f"{done} ok")
    lines.close(100, 100, "100 ok")
    written = out.getvalue().splitlines()
    assert [re.match(r"job: (\d+)/100", line).group(1) for line in written] == [  # type: ignore[union-attr]
        str(n) for n in (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100)]
    assert written[-1].startswith("job: 100/100 (100%), 100 ok, elapsed ")


def test_the_time_rule_and_a_final_line_when_the_last_update_was_held_back() -> None:
    out = io.StringIO()
    every = ProgressLines("job", out, interval_s=0.0, step_percent=1000)
    for done in range(3):
        every.update(done, None, label="loading")  # no total: counts only
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == ["loading: 0", "loading: 1", "loading: 2"]
    out = io.StringIO()
    held = ProgressLines("job", out, interval_s=1e9)
    held.update(1, 1000)
    held.update(7, 1000)  # under a step and under the interval: held back
    held.close(7, 1000)
    assert [line.split(" (")[0] for line in out.getvalue().splitlines()] == ["job: 1/1000", "job: 7/1000"]


@pytest.mark.service
def test_kev_batch_to_a_log_prints_progress_lines(tmp_path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", job_lines(20, max_tokens=lambda i: 2))
    config = config_file(tmp_path, {"core": {"kernels": "torch"}})
    done = run_batch(source, "-o", tmp_path / "out.jsonl", "--config", config)  # stderr is a pipe, not a terminal
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines()
                if line.startswith("kev batch: ") and not line.startswith("kev batch: done:")]
    assert len(progress) >= 3 and progress[-1].startswith("kev batch: 20/20 (100%), 0 failed"), done.stderr
    assert all("elapsed" in line and "tok/s" in line for line in progress)
    assert len(progress) == len(set(progress)) and sum("20/20" in line for line in progress) == 1


@pytest.mark.service
def test_kev_run_to_a_log_prints_progress_lines(capsys, tmp_path) -> None:
    from kev.cli.main import main

    config = config_file(tmp_path, {"core": {"kernels": "torch"}})
    assert main(["run", "Hi", "Name a colour.", "--max-tokens", "3", "--config", str(config), "--json"]) == 0
    lines = capsys.readouterr().err.splitlines()  # captured: not a terminal
    assert lines and lines[-1].startswith("2/2 answered") and "(100%), elapsed " in lines[-1], lines
