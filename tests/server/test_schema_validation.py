"""The published schema and the request checks agree (issue 24, point 5), in process and without a model: the
schemathesis run (test_fuzz.py) finds disagreements; these pin the rules it found, fast."""
from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

import kev
from kev.wire.bodies.api_models import QueryBody
from kev.server.app import build_app
from kev.wire.bodies.openai_models import ChatCompletionBody, CompletionBody
from kev.server.routes_tokenizer import DetokenizeBody
from kev.server.schema_limits import decimal_at_most


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(build_app(kev.load_config({}), engine_factory=lambda config: None))


def test_a_whole_number_written_as_a_float_is_that_integer() -> None:
    """JSON Schema's integer includes 2.0 (OpenAI's and vLLM's servers take it); a fraction, a string and a boolean
    stay refused."""
    completion = CompletionBody.model_validate({"model": "m", "prompt": [[1.0, 2], [3.0]], "max_tokens": 2.0,
                                                "n": 1.0, "seed": 7.0, "logprobs": 1.0})
    assert (completion.prompt, completion.max_tokens, completion.n, completion.seed) == ([[1, 2], [3]], 2, 1, 7)
    query = QueryBody.model_validate({"queries": [{"prompt_ids": [5.0], "priority": -3.0}], "timeout_ms": 1e3})
    assert query.timeout_ms == 1000 and query.engine_queries() == [{"prompt_ids": [5], "priority": -3}]
    assert DetokenizeBody.model_validate({"tokens": [1.0, 2]}).tokens == [1, 2]
    for wrong in (2.5, "2", True):
        with pytest.raises(ValidationError, match="valid integer"):
            QueryBody.model_validate({"queries": ["x"], "max_tokens": wrong})


def test_free_json_keeps_its_numbers_as_written() -> None:
    """Only integer fields are read as ints: a JSON schema's 1.0 may matter to the grammar it becomes."""
    body = ChatCompletionBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                              "guided_json": {"enum": [1.0]}, "temperature": 1})
    assert body.guided_json == {"enum": [1.0]} and isinstance(body.guided_json["enum"][0], float)  # type: ignore[index]


@pytest.mark.parametrize("top", [0, 7, 10, 99, 100, 49151, 151935])
def test_the_token_id_pattern_takes_exactly_the_ids_up_to_the_top(top: int) -> None:
    pattern = re.compile(decimal_at_most(top))
    assert all(bool(pattern.fullmatch(str(n))) == (n <= top) for n in range(0, 2 * top + 20))
    assert pattern.fullmatch(f"00{top}") and not pattern.fullmatch("") and not pattern.fullmatch("²")


def test_a_query_parameter_given_twice_is_refused_by_name(client: TestClient) -> None:
    response = client.get("/v1/batches?limit=5&limit=7")
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "limit" and "given 2 times" in response.json()["error"]["message"]


@pytest.mark.parametrize(("form", "field"), [
    ({"purpose": ""}, "purpose"), ({"purpose": "fine-tune"}, "purpose"),
    ({"purpose": "batch", "expires_after[anchor]": "created_at"}, "expires_after[seconds]"),
    ({"purpose": "batch", "expires_after[seconds]": "3600"}, "expires_after[anchor]"),
    ({"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},
     "expires_after[seconds]"),
])
def test_an_upload_form_the_schema_refuses_is_a_422_naming_the_field(client: TestClient, form: dict[str, str],
                                                                     field: str) -> None:
    response = client.post("/v1/files", data=form, files={"file": ("in.jsonl", b"{}\n")})
    assert response.status_code == 422 and response.json()["error"]["field"] == field, response.text
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    file_form = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"file": "", **form}, file_form)


def test_the_schema_says_the_cross_field_rules(client: TestClient) -> None:
    """What the routes check across fields, the schema says too (each checked here against a request the route
    refuses)."""
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    validator = _validator(schema, "ChatCompletionBody")
    chat = {"model": components["ChatCompletionBody"]["properties"]["model"]["enum"][0],
            "messages": [{"role": "user", "content": "hi"}]}
    assert validator.is_valid(chat)
    assert validator.is_valid({**chat, "guided_regex": "a", "response_format": {"type": "text"}})  # text: no structure
    assert not validator.is_valid({**chat, "guided_regex": "a", "response_format": {"type": "json_object"}})
    assert not validator.is_valid({**chat, "messages": [{"role": "tool"}]})  # content only null with tool_calls
    assert not validator.is_valid({**chat, "tool_choice": "required"})  # needs tools
    assert validator.is_valid({**chat, "guided_regex": "a", "guided_json": None})  # null is unset
    assert not validator.is_valid({**chat, "guided_regex": "a", "guided_choice": ["b"]})  # at most one structure
    assert not validator.is_valid({**chat, "structured_outputs": {"regex": "a"}, "guided_grammar": "b"})
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    forced = {**chat, "tools": [tool], "tool_choice": "required"}
    assert validator.is_valid(forced) and validator.is_valid({**forced, "response_format": {"type": "text"}})
    assert not validator.is_valid({**forced, "guided_regex": "a"})  # a forced call has its own grammar
    assert not validator.is_valid({**forced, "response_format": {"type": "json_object"}})
    assert validator.is_valid({**chat, "tools": [tool], "tool_choice": "auto", "guided_regex": "a"})
    completion = _validator(schema, "CompletionBody")
    assert not completion.is_valid({"model": chat["model"], "prompt": "x", "echo": True, "stream": True})


def _validator(schema: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A component as a root schema, its $refs pointing into $defs."""
    text = json.dumps({"$defs": schema["components"]["schemas"], "$ref": f"#/$defs/{name}"})
    return jsonschema.Draft202012Validator(json.loads(text.replace("#/components/schemas/", "#/$defs/")))


@pytest.mark.parametrize("body", [{"stop": ""}, {"stop": ["a", ""]}, {"structured_outputs": {"regex": ""}},
                                  {"structured_outputs": {"choice": ["a", ""]}}])
def test_an_empty_string_where_text_is_needed_is_told_so(body: dict[str, Any]) -> None:
    """The rule broken, not pydantic's "at least 1 item after validation"."""
    with pytest.raises(ValidationError, match="String should have at least 1 character"):
        QueryBody.model_validate({"queries": ["x"], **body})
