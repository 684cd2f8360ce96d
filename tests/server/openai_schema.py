"""Validation against OpenAI's published OpenAPI document (the component schemas shipped in
openai_schemas/openai-components.json, with their source commit and version)."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

COMPONENTS = Path(__file__).parent / "openai_schemas" / "openai-components.json"


@functools.lru_cache(maxsize=1)
def _document() -> dict[str, Any]:
    return _nullable(json.loads(COMPONENTS.read_text()))


def _nullable(node: Any) -> Any:
    """The document still marks a few fields with OpenAPI 3.0's `nullable: true`: as JSON Schema, null or the rest."""
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _nullable(value) for key, value in node.items()}
    if node.pop("nullable", False) is True:
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    document = _document()
    assert name in document["components"]["schemas"], f"{name} is not shipped (add it to the roots)"
    return jsonschema.Draft202012Validator({**document, "$ref": f"#/components/schemas/{name}"})


def conforms(instance: Any, name: str) -> None:
    """Raises with every place the instance breaks OpenAI's schema `name`."""
    errors = sorted(_validator(name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    assert not errors, f"{name}: " + "; ".join(f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors[:5])
