"""Kev: many independent questions, one forward pass, isolated channels."""
from kev.aggregator.result import Result
from kev.config import KevConfig, load_config
from kev.engine.engine import Engine
from kev.engine.request import StreamEvent
from kev.errors import ConfigError, InvalidRequestError, KevError, RejectedError, UnknownRequestError

__all__ = ["ConfigError", "Engine", "InvalidRequestError", "KevConfig", "KevError", "RejectedError", "Result",
           "StreamEvent", "UnknownRequestError", "load_config"]
__version__ = "0.1.0"
