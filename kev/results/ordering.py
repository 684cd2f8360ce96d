"""Order a request's results by aggregator mode (slot_map, seq_append, priority)."""
from __future__ import annotations

from kev.results.result import Result


def order_results(results: list[Result], mode: str, priorities: dict[int, int] | None = None) -> list[Result]:
    if mode == "slot_map":
        return sorted(results, key=lambda r: r.index)
    if mode == "seq_append":
        return sorted(results, key=lambda r: (r.finished_at or 0.0, r.index))
    if mode == "priority":
        priorities = priorities or {}
        return sorted(results, key=lambda r: (-priorities.get(r.index, 0), r.index))
    raise ValueError(f"aggregator.mode: unknown mode {mode!r}")
