"""Kev: many independent questions, one forward pass, isolated channels."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# OpenMP threads that spin without bound at every barrier make a step ~10x slower when another process shares the
# cores (1.1 s vs 0.19 s per N=16 step beside a busy neighbour); threads that sleep at once (OMP_WAIT_POLICY=PASSIVE)
# pay a futex wake-up, 40-90 us in this VM, at each of a step's ~150 parallel regions. A short bounded spin keeps
# both: GOMP_SPINCOUNT=1000 gave 1.25x PASSIVE's tokens/s at N=16 on a quiet 2-core machine and 0.93x beside a busy
# neighbour (docs/design.md, Known limits). Must be set before torch loads libgomp; an operator's OMP_WAIT_POLICY
# or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"

from kev.results.result import Result
from kev.config import KevConfig, load_config
from kev.engine.request import StreamEvent
from kev.engine.sampling_params import SamplingParams
from kev.errors import (ConfigError, InvalidRequestError, KevError, OverflowTimeoutError, RejectedError,
                        UnknownRequestError)

if TYPE_CHECKING:
    from kev.engine.engine import Engine

__all__ = ["ConfigError", "Engine", "InvalidRequestError", "KevConfig", "KevError", "OverflowTimeoutError",
           "RejectedError", "Result", "SamplingParams", "StreamEvent", "UnknownRequestError", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The engine (and torch) load on first use, so `import kev.router...` stays torch-free.
    if name == "Engine":
        from kev.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'kev' has no attribute {name!r}")
