"""Tool calling end to end with the official openai client: on the default model (no tools slot in its template:
Kev's generic prompt) and on a tiny random Qwen2 with a Qwen-style template (tools through the template).

A forced call (a named function, or `required`) is generated under its schema's grammar, so its arguments are
valid JSON for the schema every time, whatever the model would rather say."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from harness import ServerProcess
from tiny_qwen import build_tiny_qwen

from kev.model.model_store import resolve_model_path

pytestmark = pytest.mark.service

WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"], "additionalProperties": False}
TIME_ARGS = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast of a city",
                                      "parameters": WEATHER_ARGS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now in a zone",
                                      "parameters": TIME_ARGS}}]
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
ASK: list[Any] = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
KEY = "sk-tools"
# These tests are about the HTTP surface: torch ops start at once (no C++ kernel build on a busy machine).
TORCH_OPS = {"kernels": "torch"}


def _assert_valid_calls(message: Any, one: bool = False) -> None:
    assert message.tool_calls, f"no tool calls in {message}"
    assert not one or len(message.tool_calls) == 1
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _calls(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


@pytest.fixture(scope="module")
def client(start_server: Callable[..., ServerProcess]) -> Iterator[openai.OpenAI]:
    server = start_server({"router": {"default_timeout_ms": 600_000}, "core": TORCH_OPS}, api_key=KEY)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_named_function_is_valid_json_for_its_schema_every_time(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, n=6, temperature=1.0, seed=7, max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert reply.model_extra and reply.model_extra["tool_prompt"] == "kev_generic"
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        _assert_valid_calls(choice.message, one=True)
        assert choice.message.tool_calls[0].function.name == "get_weather"


def test_required_calls_an_offered_tool_one_call_without_parallel(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required", n=4,
                                           temperature=1.0, seed=3, max_tokens=64, parallel_tool_calls=False)
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _assert_valid_calls(choice.message, one=True)


def test_streamed_calls_accumulate_in_the_openai_client(client: openai.OpenAI, model: str) -> None:
    for tool_choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        with client.chat.completions.stream(model=model, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                            max_tokens=64, temperature=0, parallel_tool_calls=False) as stream:
            final = stream.get_final_completion()
        assert final.choices[0].finish_reason == "tool_calls"
        _assert_valid_calls(final.choices[0].message, one=True)
        solo = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                              max_tokens=64, temperature=0, parallel_tool_calls=False)
        assert _calls(solo.choices[0].message) == _calls(final.choices[0].message)


def _accumulate(chunks: Any) -> tuple[str | None, list[tuple[str, str]], str | None]:
    """What an agent framework builds from raw chunks: content, calls (by index) and the finish reason."""
    content, calls, reason = None, {}, None
    for chunk in chunks:
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            name, arguments = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
        reason = chunk.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_auto_answers_text_or_calls_consistently_streamed_or_not(client: openai.OpenAI, model: str) -> None:
    whole = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0)
    choice = whole.choices[0]
    streamed = _accumulate(client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=60,
                                                          temperature=0, stream=True))
    assert streamed == (choice.message.content, _calls(choice.message), choice.finish_reason)
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        _assert_valid_calls(choice.message)
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content


def test_history_with_calls_and_results_is_answered(client: openai.OpenAI, model: str) -> None:
    history: list[Any] = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C, light wind"}]
    for tools in (TOOLS, None):  # a history alone (no tools offered now) is accepted too
        extra = {"tools": tools} if tools else {}
        reply = client.chat.completions.create(model=model, messages=history, max_tokens=24, temperature=0, **extra)
        assert reply.choices[0].message.content or reply.choices[0].message.tool_calls


def test_tool_choice_none_answers_text(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none",
                                           max_tokens=16, temperature=0)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")


class Item(pydantic.BaseModel):
    sku: str
    qty: int = pydantic.Field(ge=1, le=9)
    size: Literal["S", "M", "L"]
    gift_note: str | None = None


class Order(pydantic.BaseModel):
    """Place an order of several items."""

    items: list[Item]
    express: bool


class Folder(pydantic.BaseModel):
    """A folder tree (recursive)."""

    name: str
    children: list[Folder] = pydantic.Field(max_length=2)


class Payment(pydantic.BaseModel):
    """Pay by card or by transfer."""

    method: Item | Order


class Card(pydantic.BaseModel):
    kind: Literal["card"]
    last4: str = pydantic.Field(pattern=r"^[0-9]{4}$")


class Transfer(pydantic.BaseModel):
    kind: Literal["transfer"]
    iban: str = pydantic.Field(max_length=34)


class Refund(pydantic.BaseModel):
    """Refund to a card or by transfer."""

    # a discriminated union: pydantic writes oneOf (+ discriminator); llguidance enforces a oneOf whose branches
    # it can tell apart (here by the const kind), and refuses one it cannot (test below)
    to: Annotated[Card | Transfer, pydantic.Field(discriminator="kind")]


PYDANTIC_TOOLS: list[Any] = [openai.pydantic_function_tool(m) for m in (Order, Folder, Payment, Refund)]


def _valid_for_its_model(call: Any) -> None:
    model = {"Order": Order, "Folder": Folder, "Payment": Payment, "Refund": Refund}[call.function.name]
    model.model_validate_json(call.function.arguments)  # raises when the grammar let anything else through


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "Order"}},
                                         {"type": "function", "function": {"name": "Folder"}},
                                         {"type": "function", "function": {"name": "Refund"}}, "auto"])
def test_pydantic_function_tools_with_defs_refs_and_unions(client: openai.OpenAI, model: str,
                                                           tool_choice: Any) -> None:
    """$defs/$ref (nested and recursive), anyOf, oneOf, enums, nullable fields: every forced call validates as its
    model."""
    assert "$defs" in PYDANTIC_TOOLS[0]["function"]["parameters"]
    assert "oneOf" in PYDANTIC_TOOLS[3]["function"]["parameters"]["properties"]["to"]
    reply = client.chat.completions.create(model=model, messages=ASK, tools=PYDANTIC_TOOLS, tool_choice=tool_choice,
                                           n=3, temperature=1.0, seed=5, max_tokens=160)
    for choice in reply.choices:
        if tool_choice == "auto":
            assert choice.message.content is not None or choice.message.tool_calls
            continue
        if choice.finish_reason == "length":  # a small model may nest deep: the cut call comes back partial
            assert choice.message.tool_calls
            continue
        assert choice.finish_reason == "tool_calls", choice
        for call in choice.message.tool_calls or []:
            _valid_for_its_model(call)


def test_a_schema_keyword_the_grammar_cannot_enforce_names_the_tool(client: openai.OpenAI, model: str) -> None:
    unique = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}
    for tool_choice in ("required", {"type": "function", "function": {"name": "tag"}}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=model, messages=ASK, tools=[*TOOLS, unique], tool_choice=tool_choice,
                                           max_tokens=4)
        body: Any = caught.value.body
        assert body["param"] == "tools[2].function.parameters"
        assert "'tag'" in body["message"] and "uniqueItems" in body["message"]
    # a oneOf whose branches overlap (an integer is also a number): "exactly one" is not a grammar, so it is refused,
    # never loosened to anyOf
    overlap = {"type": "function", "function": {"name": "measure", "parameters": {
        "type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK, tools=[overlap], tool_choice="required", max_tokens=4)
    body = caught.value.body
    assert body["param"] == "tools[0].function.parameters" and "oneOf" in body["message"]


def test_a_forced_call_cut_by_max_tokens_comes_back_as_calls_with_finish_length(client: openai.OpenAI,
                                                                                model: str) -> None:
    # get_weather's call is at least 10 tokens of name and 9 of arguments: 13 and 5 tokens cut its arguments.
    for tool_choice, max_tokens in (("required", 13), ({"type": "function", "function": {"name": "get_weather"}}, 5)):
        kwargs: Any = dict(model=model, messages=ASK, tools=TOOLS[:1], tool_choice=tool_choice,
                           max_tokens=max_tokens, temperature=0)
        reply = client.chat.completions.create(**kwargs)
        choice = reply.choices[0]
        assert choice.finish_reason == "length" and choice.message.content is None
        assert choice.message.tool_calls and choice.message.tool_calls[-1].function.name == "get_weather"
        content, calls, reason = _accumulate(client.chat.completions.create(**kwargs, stream=True))
        assert reason == "length" and not content and calls == _calls(choice.message)


@pytest.mark.parametrize("body, status, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400,
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, 400, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, 422, "response_format"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, 400, "tools"),
    ({"messages": [{"role": "user", "content": None}]}, 422, "messages[0]"),
])
def test_bad_tool_bodies_name_the_field(client: openai.OpenAI, model: str, body: dict[str, Any], status: int,
                                        param: str) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**{"model": model, "messages": ASK, "max_tokens": 4, **body})
    assert caught.value.status_code == status
    assert caught.value.body["param"].startswith(param)  # type: ignore[index]


@pytest.fixture(scope="module")
def qwen(start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    folder = build_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen"), resolve_model_path("smollm2-135m-instruct"))
    return start_server({"core": {"model_path": str(folder), "precision": "fp32", "max_context": 1024, **TORCH_OPS},
                         "router": {"default_timeout_ms": 600_000}}, api_key=KEY)


def test_tiny_qwen_renders_tools_through_its_template_and_forces_valid_calls(qwen: ServerProcess) -> None:
    models = httpx.get(f"{qwen.url}/v1/models", headers=qwen.headers).json()["data"][0]
    assert models["tool_prompt"] == "chat_template"
    with openai.OpenAI(base_url=f"{qwen.url}/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        named = client.chat.completions.create(
            model=models["id"], messages=ASK, tools=TOOLS, n=3, temperature=1.0, seed=1, max_tokens=64,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        required = client.chat.completions.create(model=models["id"], messages=ASK, tools=TOOLS, n=3, seed=2,
                                                  temperature=1.0, max_tokens=96, tool_choice="required",
                                                  parallel_tool_calls=False)
        assert named.model_extra and named.model_extra["tool_prompt"] == "chat_template"
        for choice in named.choices + required.choices:
            assert choice.finish_reason == "tool_calls"
            _assert_valid_calls(choice.message, one=True)
        auto = client.chat.completions.create(model=models["id"], messages=ASK, tools=TOOLS, max_tokens=8)
        assert auto.choices[0].message.content is not None or auto.choices[0].message.tool_calls


def test_tiny_qwen_history_prompt_counts_the_template_render(qwen: ServerProcess, tmp_path: Path) -> None:
    """The prompt the model read is the template's render of the tools and the history (token count matches)."""
    from kev.model.tokenizer import Tokenizer
    from kev.wire.tools.prompt import render
    from kev.wire.bodies.tool_schema import ToolCallIn, ToolDef

    history: list[Any] = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "12:00"}]
    body = {"model": "x", "messages": history, "tools": TOOLS, "max_tokens": 1}
    with httpx.Client(base_url=qwen.url, headers=qwen.headers, timeout=120) as http:
        body["model"] = http.get("/v1/models").json()["data"][0]["id"]
        usage = http.post("/v1/chat/completions", json=body).json()["usage"]
    folder = Path(json.loads((qwen.workdir / "kev.yaml").read_text())["kev"]["core"]["model_path"])
    tokenizer = Tokenizer.from_folder(folder)
    messages = [*ASK, {"role": "assistant", "content": None,
                       "tool_calls": [ToolCallIn.model_validate(history[1]["tool_calls"][0])]}, history[2]]
    text = render(tokenizer, messages, [ToolDef.model_validate(t) for t in TOOLS], "hermes").text
    assert '{"name": "get_time", "arguments": {"zone": "UTC"}}' in text
    assert usage["prompt_tokens"] == len(tokenizer.encode(text))
