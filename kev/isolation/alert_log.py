"""Read isolation alerts back from the audit log (JSON lines; alerts have "kind": "alert")."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from kev.config import KevConfig

ALERT_KINDS: tuple[str, ...] = ("cross_channel_visible", "block_in_two_tables", "write_to_readonly_block",
                                "truncation_near_boundary", "chunk_boundary_in_prefix", "shadow_mismatch")
# A soak provokes answers cut at max_context on purpose: reported, but not a failure.
EXPECTED_IN_SOAK: frozenset[str] = frozenset({"truncation_near_boundary"})


def audit_target(config: KevConfig, tmp_dir: Path, name: str) -> tuple[dict[str, Any], Path | None]:
    """(config overrides, log path): the config's own audit path, else a file in tmp_dir.

    (no overrides, None) when this Kev has no audit section: alerts cannot be collected.
    """
    audit = getattr(config, "audit", None)
    if audit is None:
        return {}, None
    if audit.path:
        return {}, Path(audit.path)
    path = tmp_dir / f"audit-{name}.jsonl"
    return {"audit": {"path": str(path)}}, path


def log_size(path: Path | None) -> int:
    return path.stat().st_size if path is not None and path.is_file() else 0


def read_alerts(path: Path, offset: int = 0) -> tuple[Counter[str], int]:
    """(alert counts by type, records read) from byte offset on (a shared log: only this run's part)."""
    counts: Counter[str] = Counter()
    records = 0
    if not path.is_file():
        return counts, records
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
            records += 1
            try:
                record = json.loads(line)
            except ValueError:
                counts["unreadable_log_line"] += 1
                continue
            if isinstance(record, dict) and record.get("kind") == "alert":
                counts[str(record.get("alert", "unknown"))] += 1
    return counts, records
