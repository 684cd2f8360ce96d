"""Circuit breaker: a channel whose queue reached breaker_threshold takes no new work;
the question goes to the least-loaded channel of its group (an idle one when there is one)."""
from __future__ import annotations

from collections.abc import Sequence

from kev.router.features import PoolView, least_loaded


class Breaker:
    def __init__(self, threshold: int | None) -> None:
        self.threshold = threshold  # None: off

    def is_open(self, channel_id: int, view: PoolView) -> bool:
        return self.threshold is not None and view.queue_length(channel_id) >= self.threshold

    def redirect(self, chosen: int, channels: Sequence[int], view: PoolView) -> int:
        """`chosen`, or a lighter channel when chosen's breaker is open (and a lighter one exists)."""
        if not self.is_open(chosen, view):
            return chosen
        target = least_loaded(channels, view)
        return target if view.load(target) < view.load(chosen) else chosen
