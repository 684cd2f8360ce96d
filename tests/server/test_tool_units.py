"""Tool calling without a server: parsers (hermes, llama3_json), stream deltas, prompts (template slot or generic)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_qwen import QWEN_STYLE_TEMPLATE

from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer
from kev.wire.tools.forced import required_schema
from kev.wire.tools.parsers import parse, parse_required
from kev.wire.tools.prompt import prompt_kind, render
from kev.wire.tools.reply import ToolReply
from kev.wire.bodies.tool_schema import ToolCallIn, ToolDef

NAMES = {"get_weather", "get_time"}
WEATHER = ToolDef.model_validate({"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [ToolCallIn.model_validate(
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}})]},
           {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"}]


def test_hermes_text_then_calls_and_invalid_blocks_stay_text() -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    parsed = parse(text, "hermes", NAMES)
    assert parsed.content == "Let me check.\n"  # the text before the first call, as vLLM gives it
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Oslo"}),
                                                                          ("get_time", {})]
    for bad in ('<tool_call>{"name": "get_weather", "arguments": {"city"', "no call here",
                '<tool_call>{"name": "not_offered", "arguments": {}}</tool_call>'):
        assert parse(bad, "hermes", NAMES).calls == [] and parse(bad, "hermes", NAMES).content == bad


def test_without_parallel_tool_calls_an_auto_answer_keeps_its_first_call() -> None:
    text = '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Rome"}}'
    assert len(ToolReply("auto", "llama3_json", NAMES, "kev_generic").parsed(text).calls) == 2
    calls = ToolReply("auto", "llama3_json", NAMES, "kev_generic", parallel=False).parsed(text).calls
    assert [c.name for c in calls] == ["get_time"]


def test_llama3_json_calls_separated_by_semicolons() -> None:
    parsed = parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; '
                   '{"name": "get_time", "parameters": {}}', "llama3_json", NAMES)
    assert parsed.content is None and [c.name for c in parsed.calls] == ["get_weather", "get_time"]
    assert parse("The answer is {not json}", "llama3_json", NAMES).calls == []


def test_required_array_parses_and_a_cut_array_is_no_call() -> None:
    calls = parse_required('[{"name": "get_time", "parameters": {"zone": "UTC"}}]', NAMES)
    assert calls is not None and calls[0].name == "get_time" and json.loads(calls[0].arguments) == {"zone": "UTC"}
    assert parse_required('[{"name": "get_time", "param', NAMES) is None
    schema = required_schema([WEATHER], parallel=False)["json"]
    assert schema["maxItems"] == 1 and schema["items"]["anyOf"][0]["properties"]["name"] == {"const": "get_weather"}


def test_required_grammar_moves_each_tools_defs_under_its_own_name() -> None:
    item = {"type": "object", "properties": {"n": {"type": "integer"}}}
    tool = ToolDef.model_validate({"type": "function", "function": {"name": "order", "parameters": {
        "$defs": {"Item": item}, "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}, "sub": {"$ref": "#"}}}}})
    schema = required_schema([WEATHER, tool], parallel=True)["json"]
    moved = schema["$defs"]["tool1"]
    assert moved["properties"]["items"]["items"] == {"$ref": "#/$defs/tool1/$defs/Item"}
    assert moved["properties"]["sub"] == {"$ref": "#/$defs/tool1"}
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"$ref": "#/$defs/tool1"}


def test_a_call_cut_by_max_tokens_keeps_the_whole_calls_and_the_partial_one() -> None:
    cut = '[{"name": "get_time", "parameters": {"zone": "UTC"}}, {"name": "get_weather", "parameters": {"ci'
    calls = parse_required(cut, NAMES, cut=True)
    assert calls is not None and [c.name for c in calls] == ["get_time", "get_weather"]
    assert calls[1].arguments == '{"ci'
    assert parse_required(cut, NAMES) is None  # an answer that ended on its own and does not parse is no call
    hermes = 'Sure. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n<tool_call>\n' \
             '{"name": "get_weather", "arguments": {"city": "Pa'
    parsed = parse(hermes, "hermes", NAMES, cut=True)
    assert parsed.content == "Sure. " and [c.arguments for c in parsed.calls] == ['{"zone": "UTC"}', '{"city": "Pa']
    assert parse(hermes, "hermes", NAMES).calls == []
    reply = ToolReply("required", "hermes", NAMES, "kev_generic")
    content, streamed, finish = _stream(reply, [cut[:30], cut[30:]], reason="length")
    assert finish == "length" and content == "" and [c["function"]["name"] for c in streamed] == \
        ["get_time", "get_weather"]


def _stream(reply: ToolReply, pieces: list[str], reason: str = "stop") -> tuple[str, list[dict], str | None]:
    content, calls = "", []
    deltas = [d for piece in pieces for d in reply.deltas(0, piece)]
    closing, finish = reply.closing(0, reason)
    for delta in deltas + closing:
        content += delta.get("content", "")
        calls += delta.get("tool_calls", [])
    return content, calls, finish


def test_auto_streams_text_and_holds_a_call_until_it_is_whole() -> None:
    reply = ToolReply("auto", "hermes", NAMES, "kev_generic")
    pieces = ["Sure", ". <tool", '_call>\n{"name": "get_time", ', '"arguments": {}}\n</tool_call>']
    assert reply.deltas(0, pieces[0]) == [{"content": "Sure"}]
    assert reply.deltas(0, pieces[1]) == [{"content": ". "}]  # "<tool" may begin a call: held
    content, calls, finish = _stream(reply, pieces[2:])
    assert content == "" and finish == "tool_calls"
    assert calls[0]["function"] == {"name": "get_time", "arguments": "{}"} and calls[0]["id"].startswith("call_")
    content, calls, finish = _stream(ToolReply("auto", "hermes", NAMES, "kev_generic"), ["a <tool", "box> b"])
    assert (content, calls, finish) == ("a <toolbox> b", [], "stop")
    blank = ToolReply("auto", "hermes", NAMES, "kev_generic")
    assert blank.deltas(0, "\n ") == []  # blanks before a call are no content
    content, calls, finish = _stream(blank, ['<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'])
    assert content == "" and len(calls) == 1 and blank.parsed("\n <tool_call>{\"name\": \"get_time\"}").content is None


def test_named_streams_arguments_as_generated() -> None:
    reply = ToolReply("named", "hermes", NAMES, "kev_generic", named="get_weather")
    content, calls, finish = _stream(reply, ['{"city"', ': "Oslo"}'])
    assert content == "" and finish == "tool_calls"
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and "id" in calls[0]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Oslo"}'
    assert all(c["index"] == 0 for c in calls)


@pytest.fixture(scope="module")
def default_tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(resolve_model_path("smollm2-135m-instruct"))


def test_template_without_tools_slot_gets_the_generic_system_message(default_tokenizer: Tokenizer) -> None:
    assert prompt_kind(default_tokenizer) == "kev_generic"
    text = render(default_tokenizer, [{"role": "system", "content": "Be brief."}, *HISTORY], [WEATHER], "hermes").text
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\nYou may call functions") and '"get_weather"' in system
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    llama = render(default_tokenizer, HISTORY, [WEATHER], "llama3_json").text
    assert '"parameters": <arguments-json-object>' in llama and '{"name": "get_weather", "parameters"' in llama


def test_template_with_tools_slot_renders_tools_and_calls_as_objects(tmp_path: Path) -> None:
    shutil.copy(resolve_model_path("smollm2-135m-instruct") / "tokenizer.json", tmp_path)
    tokenizer = Tokenizer.from_folder(tmp_path, QWEN_STYLE_TEMPLATE)
    assert prompt_kind(tokenizer) == "chat_template"
    text = render(tokenizer, HISTORY, [WEATHER], "hermes").text
    assert "# Tools" in text and json.dumps(WEATHER.model_dump(exclude_none=True)) in text
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # arguments rendered as an object
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text and "You may call functions" not in text
