"""Kev: many independent questions, one forward pass, isolated channels."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# OpenMP threads that spin at every barrier make a step ~10x slower when another process shares
# the cores (measured: 1.1 s vs 0.19 s per N=16 step beside a busy neighbour): they sleep instead.
# Must be set before torch loads its OpenMP runtime; an operator's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from kev.aggregator.result import Result
from kev.config import KevConfig, load_config
from kev.engine.request import StreamEvent
from kev.errors import (ConfigError, InvalidRequestError, KevError, OverflowTimeoutError, RejectedError,
                        UnknownRequestError)

if TYPE_CHECKING:
    from kev.engine.engine import Engine

__all__ = ["ConfigError", "Engine", "InvalidRequestError", "KevConfig", "KevError", "OverflowTimeoutError",
           "RejectedError", "Result", "StreamEvent", "UnknownRequestError", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The engine (and torch) load on first use, so `import kev.router...` stays torch-free.
    if name == "Engine":
        from kev.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'kev' has no attribute {name!r}")
