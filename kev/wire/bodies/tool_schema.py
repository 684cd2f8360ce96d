"""Tool-calling bodies, as the OpenAI API spells them."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kev.wire.bodies.api_models import Text

FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class _ToolBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class FunctionDef(_ToolBody):
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments object")
    strict: bool | None = None

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """What the arguments must be: the declared schema, or any object (OpenAI's default)."""
        return self.parameters if self.parameters is not None else {"type": "object"}


class ToolDef(_ToolBody):
    type: Literal["function"]
    function: FunctionDef


class FunctionRef(_ToolBody):
    name: FunctionName


class NamedToolChoice(_ToolBody):
    type: Literal["function"]
    function: FunctionRef


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_ToolBody):
    name: FunctionName
    arguments: Text = Field(description="the arguments as a JSON text")


class ToolCallIn(_ToolBody):
    """A call an earlier assistant turn made (in a history sent back with its results)."""

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: dict[str, str] = Field(description="{name, arguments}: arguments is a JSON text")
