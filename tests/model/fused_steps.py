"""What both fused-op test files check first: that some step really ran the one-call decoder op."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kev.model.fused_layers import FusedLayers


@contextmanager
def counting_fused_steps() -> Iterator[list[bool]]:
    """Yields a list that gets, per step inside the block, whether the fused op ran it."""
    used: list[bool] = []
    run = FusedLayers.run

    def counted(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        used.append(out is not None)
        return out

    FusedLayers.run = counted  # type: ignore[method-assign]
    try:
        yield used
    finally:
        FusedLayers.run = run  # type: ignore[method-assign]
