"""A BatchLine's body becomes the engine call it stands for, by the routes' own engine call
(kev/wire/engine_call.py), so a line is refused for exactly what the route would refuse, naming the same field.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from kev.batch.input_file import CHAT_URL, BatchLine, LineError
from kev.config import KevConfig
from kev.wire.bodies.errors import ApiError, validation_error
from kev.wire.bodies.openai_models import ChatCompletionBody, CompletionBody
from kev.wire.engine_call import EngineCall, Served, chat_call, completion_call, served_model_name
from kev.wire.limits import Limits


@dataclass(frozen=True)
class BatchRequest:
    """One line, ready for EngineBridge.submit: its body's engine call, as the route would make it."""

    line: BatchLine
    call: EngineCall

    @property
    def custom_id(self) -> str:
        return self.line.custom_id


@dataclass(frozen=True)
class RequestBuilder:
    served: Served
    defaults: dict[str, Any]  # body fields a line does not set (kev batch --max-tokens, --temperature)

    @classmethod
    def from_config(cls, config: KevConfig, defaults: dict[str, Any] | None = None) -> RequestBuilder:
        return cls(Served(served_model_name(config), Limits.from_config(config), batch_line=True), defaults or {})

    @property
    def model_name(self) -> str:
        return self.served.model_name

    def build(self, line: BatchLine) -> BatchRequest:
        """Raises LineError naming the line and the body field at fault."""
        body = {"model": self.model_name, **self.defaults, **line.body}
        try:
            if line.url == CHAT_URL:
                return BatchRequest(line, chat_call(ChatCompletionBody.model_validate(body), self.served))
            return BatchRequest(line, completion_call(CompletionBody.model_validate(body), self.served))
        except ValidationError as invalid:  # the route's own wording and status (422) for the same problem
            problems = [{**p, "loc": ("body", *p.get("loc", ()))} for p in invalid.errors()]
            err = validation_error(RequestValidationError(problems))
            field = f"body.{err.field}" if err.field != "body" else "body"
            message = err.message.removeprefix(f"{err.field}: ")
            raise LineError(line.line_no, line.custom_id, field, message, err.status_code) from None
        except ApiError as err:
            field = f"body.{err.field}" if err.field else "body"
            message = err.message.removeprefix(f"{err.field}: ") if err.field else err.message
            raise LineError(line.line_no, line.custom_id, field, message, err.status_code) from None


def build_all(lines: list[BatchLine], builder: RequestBuilder) -> tuple[list[BatchRequest], list[LineError]]:
    requests: list[BatchRequest] = []
    errors: list[LineError] = []
    for line in lines:
        try:
            requests.append(builder.build(line))
        except LineError as err:
            errors.append(err)
    return requests, errors
