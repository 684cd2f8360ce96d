"""The output file: whole lines appended as each answer finishes, and what a resumed job finds there.

Each line is one os.write of the complete line (newline included) to a file opened with
O_APPEND, so it is in the OS the moment write returns: a SIGKILL right after loses nothing.
A kill in the middle of a write can leave at most the last line torn (no newline); resume()
cuts it off, and that request is run again.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kev.batch.records import is_failure, record_key, usage_of
from kev.errors import KevError


@dataclass
class Resumed:
    """What an earlier run of the same job left in the output file."""

    keys: set[str] = field(default_factory=set)  # custom_ids (and unreadable-line keys) already answered
    num_failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    torn_bytes: int = 0  # the torn last line that was cut off


def resume(path: Path) -> Resumed:
    """Read an existing output file (cutting off a torn last line); a missing file is an empty one."""
    found = Resumed()
    if not path.exists():
        return found
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        found.torn_bytes = len(data) - end
        with path.open("r+b") as f:
            f.truncate(end)
    for number, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        try:
            record = json.loads(raw)
            key = record_key(record)
        except (ValueError, AttributeError):
            key = None
        if key is None:
            raise KevError(f"{path} line {number}: not a batch output line; is it the output of another file?")
        if key in found.keys:
            raise KevError(f"{path} line {number}: custom_id {key!r} appears twice; "
                           "the file was not written by kev batch")
        found.keys.add(key)
        found.num_failed += is_failure(record)
        prompt, completion = usage_of(record)
        found.prompt_tokens += prompt
        found.completion_tokens += completion
    return found


class OutputFile:
    """Appends one JSON line per write(); `None` path = standard output."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is None:
            self._fd, self._owned = sys.stdout.fileno(), False
            sys.stdout.flush()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            # answers: readable by their owner alone
            self._fd, self._owned = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), True
        self._failed: OSError | None = None

    def write(self, record: dict[str, Any]) -> None:
        if self._failed is not None:  # after a failed write nothing more is written: no line after a torn one
            raise self._failed
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        view = memoryview(data)
        start = os.lseek(self._fd, 0, os.SEEK_END) if self._owned else None
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as err:  # a full disk: cut the torn line off now (freeing needs no space), name the file
            if start is not None:
                try:
                    os.ftruncate(self._fd, start)
                except OSError:
                    pass  # resume() cuts it off instead
            self._failed = OSError(err.errno, err.strerror, str(self.path or "standard output"))
            raise self._failed from None

    def close(self) -> None:
        if self._owned:
            os.fsync(self._fd)
            os.close(self._fd)
            self._owned = False
