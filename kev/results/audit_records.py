"""Result records of the audit log (audit.path), and reading the log back.

The log is JSON lines, each with a "kind" (kev.engine.kv.audit.AuditLog writes them:
steps, KV allocations, alerts, shadows). Every delivered result is one record of kind
"result": the audit fields of SPEC §4 plus queue_ms, category, the original and the
normalized text; level "full" adds the answer's text and token ids. Readers skip kinds
they do not know.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kev.results.result import Result

_FULL_ONLY = ("text", "token_ids")


def result_fields(result: Result, level: str = "summary") -> dict[str, Any]:
    fields = result.to_dict()
    if level != "full":
        for key in _FULL_ONLY:
            fields.pop(key, None)
    return fields


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
