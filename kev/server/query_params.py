"""A query parameter the schema declares as one value (every one Kev has) may come only once: FastAPI would keep
the last of `?limit=5&limit=7` and answer as if the caller had meant it (issue 24: the schema is the validation)."""
from __future__ import annotations

from fastapi import Request

from kev.wire.bodies.errors import ApiError


def one_value_each(request: Request) -> None:
    """A router dependency: 422 naming the first query parameter given more than once."""
    seen: set[str] = set()
    for key, _ in request.query_params.multi_items():
        if key in seen:
            count = len(request.query_params.getlist(key))
            raise ApiError(422, f"{key}: given {count} times; it takes one value", key)
        seen.add(key)
