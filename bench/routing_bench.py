"""Routing under skewed traffic (kev/bench/routing.py); the same as `kev bench --scenario routing`."""
from __future__ import annotations

from kev.bench.routing import main

if __name__ == "__main__":
    raise SystemExit(main())
