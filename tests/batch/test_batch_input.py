"""Reading and checking a batch file before any compute, and reading back an output file to resume: no model needed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import kev
from kev import SamplingParams
from kev.batch.input_file import read_lines
from kev.cli.batch_job import InvalidInputError, JobOptions, prepare
from kev.batch.output_file import OutputFile, resume
from kev.batch.requests import RequestBuilder, build_all
from kev.errors import KevError

CONFIG = kev.load_config({})
MODEL = "smollm2-135m-instruct"


def openai_line(custom_id: str, url: str = "/v1/chat/completions", **body: object) -> str:
    body = body or {"messages": [{"role": "user", "content": "Hi"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_the_three_input_forms_read_as_requests() -> None:
    lines = [openai_line("a", model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0),
             openai_line("b", "/v1/completions", prompt=["x", "y"], n=2, max_tokens=2),
             json.dumps({"prompt": "Once", "max_tokens": 5}), "",
             json.dumps({"messages": [{"role": "user", "content": "Q"}]})]
    read, errors = read_lines(lines, "jsonl")
    assert errors == []
    assert [(r.line_no, r.custom_id, r.url) for r in read] == [
        (1, "a", "/v1/chat/completions"), (2, "b", "/v1/completions"), (3, "3", "/v1/completions"),
        (5, "5", "/v1/chat/completions")]
    requests, invalid = build_all(read, RequestBuilder.from_config(CONFIG))
    assert invalid == []
    assert requests[0].call.queries == [{"messages": [{"role": "user", "content": "Hi"}]}]
    assert requests[0].call.sampling == SamplingParams(max_tokens=3, temperature=0) and requests[0].call.options == {}
    assert [q["prompt"] for q in requests[1].call.queries] == ["x", "x", "y", "y"] and requests[1].call.shape.n == 2
    assert requests[2].call.sampling.max_tokens == 5
    txt, errors = read_lines(["What is 2+2?", "", "Name a fruit.\r"], "txt")
    assert errors == [] and [(r.custom_id, r.body["messages"][0]["content"]) for r in txt] == [
        ("1", "What is 2+2?"), ("3", "Name a fruit.")]


@pytest.mark.parametrize(("line", "where"), [
    ('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {', "line 1: not valid JSON"),
    ("[1, 2]", "line 1: must be a JSON object"),
    (openai_line("a", "/v1/embeddings"), "line 1: url: unknown url '/v1/embeddings'"),
    (json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}), "line 1: custom_id: is required"),
    (json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}), "line 1: method:"),
    (json.dumps({"text": "hi"}), "line 1: needs exactly one of prompt or messages"),
])
def test_an_unreadable_line_names_its_line_and_field(line: str, where: str) -> None:
    _, errors = read_lines([line], "jsonl")
    assert len(errors) == 1 and str(errors[0]).startswith(where), str(errors[0])


@pytest.mark.parametrize(("body", "where"), [
    ({"messages": [{"role": "robot", "content": "x"}]}, "body.messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "8"}, "body.max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "body.temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "body.stream"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4o"}, "body.model"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, "body.max_tokens"),
    ({"temperature": 0}, "body.messages"),
])
def test_an_invalid_body_field_is_named(body: dict, where: str) -> None:
    read, _ = read_lines([openai_line("a", **body)], "jsonl")
    _, invalid = build_all(read, RequestBuilder.from_config(CONFIG))
    assert len(invalid) == 1 and str(invalid[0]).startswith(f"line 1: {where}: "), str(invalid[0])


def test_duplicate_custom_ids_and_bad_lines_stop_the_job_before_anything_runs(tmp_path: Path) -> None:
    lines = [openai_line("a"), openai_line("b"), openai_line("a"), "not json", openai_line("c", messages=[])]
    out = tmp_path / "out.jsonl"
    with pytest.raises(InvalidInputError) as caught:
        prepare(CONFIG, lines, "jsonl", "in.jsonl", JobOptions(out))
    message = str(caught.value)
    assert "in.jsonl line 3: custom_id: 'a' is a duplicate (first on line 1)" in message
    assert "in.jsonl line 4: not valid JSON" in message
    assert "in.jsonl line 5: body.messages:" in message
    assert "nothing was run" in message and not out.exists()
    job = prepare(CONFIG, lines, "jsonl", "in.jsonl", JobOptions(out, skip_invalid=True))
    assert [r.custom_id for r in job.requests] == ["a", "b"] and len(job.invalid) == 3


def test_resume_cuts_a_torn_last_line_and_skips_what_is_done(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    writer = OutputFile(out)
    for custom_id in ("a", "b"):
        writer.write({"id": "batch_req_1", "custom_id": custom_id, "error": None, "response": {
            "status_code": 200, "request_id": "r", "body": {"usage": {"prompt_tokens": 3, "completion_tokens": 2}}}})
    writer.close()
    whole = out.read_bytes()
    out.write_bytes(whole + b'{"id": "batch_req_2", "custom_id": "c", "resp')  # killed in the middle of a write
    lines = [openai_line(c) for c in "abcd"]
    job = prepare(CONFIG, lines, "jsonl", "in.jsonl", JobOptions(out))
    assert out.read_bytes() == whole, "the torn line is cut off"
    assert [r.custom_id for r in job.requests] == ["c", "d"]
    assert (job.tally.num_done, job.tally.prompt_tokens, job.tally.completion_tokens) == (2, 6, 4)
    assert resume(out).keys == {"a", "b"}


def test_an_output_file_of_another_job_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    stray = {"id": "x", "custom_id": "zz", "response": None, "error": {"code": "e", "message": "m"}}
    out.write_text(json.dumps(stray) + "\n")
    with pytest.raises(KevError, match="holds custom_id 'zz', which is not in in.jsonl"):
        prepare(CONFIG, [openai_line("a")], "jsonl", "in.jsonl", JobOptions(out))
    out.write_text("hello\n")
    with pytest.raises(KevError, match="line 1: not a batch output line"):
        prepare(CONFIG, [openai_line("a")], "jsonl", "in.jsonl", JobOptions(out))


def test_route_options_carry_over_and_unsupported_ones_are_named() -> None:
    lines = [openai_line("a", messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=2, n=2,
                         best_of=3, temperature=0.5, seed=1),
             openai_line("b", "/v1/completions", prompt=[1, 2, 3], echo=True, max_tokens=2),
             openai_line("c", messages=[{"role": "user", "content": "Hi"}],
                         tools=[{"type": "function", "function": {"name": "f"}}])]
    requests, invalid = build_all(read_lines(lines, "jsonl")[0], RequestBuilder.from_config(CONFIG))
    chat, completion = (request.call for request in requests)
    assert (chat.shape.n, chat.keep, chat.logprobs, len(chat.queries)) == (3, 2, True, 3)
    assert chat.sampling.logprobs == 2 and [q["seed"] for q in chat.queries] == [1, 2, 3]
    assert completion.queries == [{"prompt_ids": [1, 2, 3]}] and completion.echo == ([1, 2, 3],)
    assert [str(e) for e in invalid] == ["line 3: body.tools: tool calling is not supported in a batch line "
                                         "(/v1/chat/completions takes it)"]


def test_the_default_inflight_covers_every_channel_and_more() -> None:
    from kev.batch.local_backend import default_max_inflight

    for router in ({}, {"channel_queue_depth": 0}, {"channel_queue_depth": 4}):
        config = kev.load_config({"router": router})
        assert default_max_inflight(config) >= 2 * config.router.channel_pool_size
    assert default_max_inflight(kev.load_config({"batch": {"max_inflight": 3}})) == 3
