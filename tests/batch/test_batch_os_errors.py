"""`kev batch` meets the file system's refusals as one line naming the path and what to do, exit 2, never a
traceback; a disk that fills mid-job loses nothing (the torn line is cut off and the resume finishes the job). The
refusals are raised in-process (the tests run as root on a shared machine: no chmod or mount can make them real)."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from kev.batch import output_file
from kev.cli.main import main
from tests.batch.batch_files import config_file, job_lines, read_output, write_jsonl

pytestmark = pytest.mark.slow


def run(folder: Path, out: Path, capsys: pytest.CaptureFixture) -> tuple[int, list[str]]:
    source = write_jsonl(folder / "in.jsonl", job_lines(6, max_tokens=lambda i: 3))
    code = main(["batch", str(source), "-o", str(out), "--config", str(config_file(folder)), "--quiet"])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("kev batch:")]


def test_a_read_only_output_folder_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out, real_open = tmp_path / "ro" / "out.jsonl", os.open

    def refuse(path: str, *args: int) -> int:
        if str(path) != str(out):
            return real_open(path, *args)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(output_file.os, "open", refuse)  # os itself: only the output file's open is refused
    code, [line] = run(tmp_path, out, capsys)
    assert code == 2 and str(out) in line and "read-only" in line, line


def test_a_full_disk_mid_job_is_one_line_and_the_resume_loses_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out, real_write, writes = tmp_path / "out.jsonl", os.write, []

    def fill_up(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != str(out):
            return real_write(fd, data)
        writes.append(fd)
        if len(writes) == 3:  # the third line: half of it lands, then the disk is full
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(output_file.os, "write", fill_up)
    code, [line] = run(tmp_path, out, capsys)
    assert code == 2 and str(out) in line and "no space left" in line, line
    written = read_output(out)  # the torn half line is cut off at once, and nothing is written after it
    assert len(written) == 2 and out.read_bytes().endswith(b"\n")
    monkeypatch.setattr(output_file.os, "write", real_write)
    code, _ = run(tmp_path, out, capsys)
    assert code == 0
    ids = [record["custom_id"] for record in read_output(out)]  # every request exactly once
    assert sorted(ids) == [f"req-{i:03d}" for i in range(6)]


def test_an_unreadable_config_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    config, real_read = config_file(tmp_path), Path.read_text

    def denied(path: Path, *args: object, **kwargs: object) -> str:
        if path == config:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_read(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", denied)  # root ignores chmod: the refusal is raised in-process
    source = write_jsonl(tmp_path / "in.jsonl", job_lines(1))
    assert main(["batch", str(source), "-o", str(tmp_path / "out.jsonl"), "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert str(config) in line and "permission denied" in line, line
