"""AuditLog: the audit file (audit.path), one JSON object per line, appended.

Every record has a "kind". Results are kind "result": the audit fields of SPEC §4 plus
queue_ms, the original and normalized text; level "full" adds the answer's text and
token ids. Other parts of Kev write their own kinds (e.g. per-step mask summaries) to
the same file through write(); readers skip kinds they do not know.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from kev.aggregator.result import Result

_FULL_ONLY = ("text", "token_ids")


def result_record(result: Result, level: str = "summary") -> dict[str, Any]:
    record = {"kind": "result", **result.to_dict()}
    if level != "full":
        for key in _FULL_ONLY:
            record.pop(key, None)
    return record


class AuditLog:
    def __init__(self, path: str | Path, level: str = "summary") -> None:
        self.path, self.level = Path(path), level
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()  # writers on several threads never interleave inside a line

    def write(self, kind: str, record: dict[str, Any]) -> None:
        line = json.dumps({"kind": kind, **record}, ensure_ascii=False, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def write_result(self, result: Result) -> None:
        record = result_record(result, self.level)
        self.write(record.pop("kind"), record)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_records(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of an audit file (of one kind, if given); a torn last line is skipped."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or record.get("kind") == kind:
            records.append(record)
    return records
