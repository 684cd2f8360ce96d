"""GET / (the page) and GET /playground/{name} (its CSS and JS), read from the package's static/ folder."""
from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from kev.wire.bodies.errors import ApiError
from kev.server.playground import ASSETS

router = APIRouter(include_in_schema=False)
# 'self' only: the page can reach Kev and nothing else (no CDN, no beacon), and cannot be framed.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
            "Referrer-Policy": "no-referrer"}


def _read(name: str) -> bytes:
    # Read on every request (they are small): an editable install serves edits without a restart.
    return files("kev.server.playground").joinpath("static", name).read_bytes()


def _asset(name: str) -> Response:
    return Response(_read(name), media_type=ASSETS[name], headers=_HEADERS)


@router.get("/")
async def page() -> Response:
    return _asset("index.html")


@router.get("/playground/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:  # a fixed list: no path from the caller ever reaches the file system
        raise ApiError(404, f"name: {name!r} is not a playground file", "name")
    return _asset(name)
