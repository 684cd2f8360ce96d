"""The channel playground: one dependency-free page that kev serve ships at "/".

PAGE_PATHS are served without the API key (they hold no secret); every API call the
page makes carries the key the user types, like any other client.
"""
from __future__ import annotations

ASSETS: dict[str, str] = {  # file in static/ -> its media type
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "lanes.js": "text/javascript; charset=utf-8",
    "pool.js": "text/javascript; charset=utf-8",
    "rows.js": "text/javascript; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
}
ASSET_PREFIX = "/playground/"
PAGE_PATHS = frozenset({"/", *(ASSET_PREFIX + name for name in ASSETS)})
