"""Log set-up of every command: text (a timestamp, level, logger, message) or JSON lines (--log-format json).

uvicorn's loggers are routed through the same handler, so a server's log is one format throughout.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, message, and the figures a call passed as `extra`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                                + f".{int(record.msecs):03d}Z", "level": record.levelname, "logger": record.name,
                                "message": record.getMessage()}
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(level: int, log_format: str = "text") -> None:
    """The root handler on stderr; uvicorn's loggers propagate to it (serve passes uvicorn log_config=None)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def add_log_flags(parser: Any) -> None:
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="text lines, or one JSON object a line (ts, level, logger, message, fields)")
