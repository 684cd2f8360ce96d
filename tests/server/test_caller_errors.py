"""A caller's mistake is never a 500, on any surface: every structured-output kind in an impossible form, and a
prompt longer than the context, sent to the OpenAI routes, their streams, the Kev API, an HTTP batch and
`kev batch`. Each is a 400 naming the body field it came in, or a 422 where the published schema states the
rule (a batch line carries exactly the live route's error), no library's internal text reaches the caller, and
the server log holds the full text with the request id."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from harness import ServerProcess, read_sse

from tests.batch.batch_files import config_file, read_output, run_batch, write_jsonl

pytestmark = [pytest.mark.service, pytest.mark.slow]
MODEL = "smollm2-135m-instruct"
KEY = "sk-kev-errors"
MAX_CONTEXT = 512
LONG = "word " * (2 * MAX_CONTEXT)  # about 1,000 tokens: over core.max_context, under max_question_chars
# Constraints that can match nothing (found before the question takes a channel) or that lead nowhere after
# the first token (found while answering), one per structured-output field; (body extra, the field named).
IMPOSSIBLE: list[tuple[dict[str, Any], str]] = [
    ({"guided_regex": "[^\\s\\S]"}, "guided_regex"),
    ({"guided_grammar": "start: /[^\\s\\S]/"}, "guided_grammar"),
    ({"guided_json": {"allOf": [{"type": "string"}, {"type": "integer"}]}}, "guided_json"),
    ({"guided_choice": [""]}, "guided_choice[0]"),  # the schema states it: a 422 naming the item
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 5, "maxLength": 2}}}},
     "response_format"),
    ({"structured_outputs": {"regex": "a[^\\s\\S]"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "start: \"a\" b\nb: /[^\\s\\S]/"}}, "structured_outputs"),  # mid-answer
]
SCHEMA_STATED = {"guided_choice[0]"}  # impossible forms the published schema already refuses (422, not 400)
INTERNALS = ("<state>", "NoExtensionBias", "Parser:", "lexer_cost", "Traceback", "the engine failed")
CASES = [pytest.param(extra, field, id=field + str(i)) for i, (extra, field) in enumerate(IMPOSSIBLE)]


def chat_body(extra: dict[str, Any], content: str = "Say something.") -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 6, **extra}


def status_for(field: str) -> int:
    return 422 if field in SCHEMA_STATED else 400


def assert_callers_error(error: dict[str, Any], field: str) -> None:
    assert error["type"] == "invalid_request_error" and error["param"] == field == error["field"], error
    assert error["message"].startswith(f"{field}: "), error
    assert not any(text in error["message"] for text in INTERNALS), error["message"]


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    folder = tmp_path_factory.mktemp("kev-errors")
    return start_server({"core": {"max_context": MAX_CONTEXT}, "router": {"default_timeout_ms": 600_000},
                         "batch": {"dir": str(folder)}}, api_key=KEY)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def live(http: httpx.Client) -> dict[str, dict[str, Any]]:
    """Each impossible body on the live chat route: the error it answers, by body field index."""
    answers = {}
    for i, (extra, field) in enumerate(IMPOSSIBLE):
        response = http.post("/v1/chat/completions", json=chat_body(extra))
        assert response.status_code == status_for(field), response.text
        answers[f"c{i}"] = response.json()
    return answers


@pytest.mark.parametrize("extra, field", CASES)
def test_the_chat_route_answers_400_naming_the_field(live, extra, field) -> None:
    assert_callers_error(live[f"c{IMPOSSIBLE.index((extra, field))}"]["error"], field)


@pytest.mark.parametrize("extra, field", CASES)
def test_the_completions_route_and_its_stream_answer_400(http: httpx.Client, extra, field) -> None:
    body = {"model": MODEL, "prompt": "Say something.", "max_tokens": 6, **extra}
    if field == "response_format":
        return  # a chat-only field
    plain = http.post("/v1/completions", json=body)
    assert plain.status_code == status_for(field), plain.text
    assert_callers_error(plain.json()["error"], field)
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        response.read()
        if response.status_code == 200:  # found only while answering: the stream's error event says it
            events = [data for _, data in read_sse(response.text.splitlines()) if isinstance(data, dict)]
            errors = [e["error"] for e in events if "error" in e]
            assert len(errors) == 1, events
            assert_callers_error(errors[0], field)
        else:
            assert response.status_code == status_for(field), response.text
            assert_callers_error(response.json()["error"], field)


def test_a_chat_stream_with_a_dead_end_grammar_ends_in_a_400_event(http: httpx.Client) -> None:
    extra, field = IMPOSSIBLE[-1]
    with http.stream("POST", "/v1/chat/completions", json={**chat_body(extra), "stream": True}) as response:
        response.read()
    assert response.status_code == 200  # the constraint was well formed: the dead end shows only once reached
    errors = [d["error"] for _, d in read_sse(response.text.splitlines()) if isinstance(d, dict) and "error" in d]
    assert len(errors) == 1
    assert_callers_error(errors[0], field)
    assert "allows no text after 1 tokens" in errors[0]["message"]


def test_the_kev_api_names_the_question_and_spares_its_neighbours(http: httpx.Client, server: ServerProcess) -> None:
    queries = [{"text": "Say something.", "structured_outputs": {"regex": "[^\\s\\S]"}},
               {"text": "Say something.", "structured_outputs": {"grammar": "start: \"a\" b\nb: /[^\\s\\S]/"}},
               {"text": LONG}, "Say hello."]
    response = http.post("/v1/query", json={"queries": queries, "max_tokens": 4})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["error_field"] for r in results] == ["queries[0].structured_outputs", "queries[1].structured_outputs",
                                                  "queries[2]", None]
    assert [r["status"] for r in results] == ["error", "error", "error", "ok"]
    assert results[0]["error"] == "queries[0].structured_outputs: the regex can match no text"
    assert not any(text in (r["error"] or "") for r in results for text in INTERNALS)
    request_id = response.json()["request_id"]
    logged = [line for line in server.log().splitlines() if request_id in line]
    assert any("NoExtensionBias" in line for line in logged), "the full text goes to the log with the request id"


def test_a_request_level_constraint_that_matches_nothing_is_a_400_on_the_kev_api(http: httpx.Client) -> None:
    impossible = {"regex": "[^\\s\\S]"}
    response = http.post("/v1/query", json={"queries": ["Say something.", "Hi."], "max_tokens": 4,
                                            "structured_outputs": impossible})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "structured_outputs" and "can match no text" in error["message"], error
    overridden = http.post("/v1/query", json={"queries": ["Hi.", {"text": "Hi.", "structured_outputs": impossible}],
                                              "max_tokens": 4, "structured_outputs": {"regex": "[a-z ]+"}})
    assert overridden.status_code == 200, overridden.text  # the override's failure is that question's own
    assert [r["status"] for r in overridden.json()["results"]] == ["ok", "error"]


def test_a_prompt_over_the_context_is_400_naming_messages_or_prompt(http: httpx.Client) -> None:
    chat = http.post("/v1/chat/completions", json=chat_body({}, LONG))
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages", chat.text
    text = http.post("/v1/completions", json={"model": MODEL, "prompt": LONG, "max_tokens": 2})
    assert text.status_code == 400 and text.json()["error"]["param"] == "prompt", text.text


def batch_lines() -> list[dict[str, Any]]:
    """Lines whose error shows when answered (one the schema refuses fails the whole input at validation instead,
    naming its line: tests/batch)."""
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(extra)}
             for i, (extra, field) in enumerate(IMPOSSIBLE) if field not in SCHEMA_STATED]
    lines.append({"custom_id": "long", "method": "POST", "url": "/v1/chat/completions", "body": chat_body({}, LONG)})
    lines.append({"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": chat_body({})})
    return lines


def assert_lines_are_the_live_errors(records: list[dict[str, Any]], live: dict[str, dict[str, Any]],
                                     http: httpx.Client) -> None:
    by_id = {r["custom_id"]: r["response"] for r in records}
    assert by_id["ok"]["status_code"] == 200
    long_live = http.post("/v1/chat/completions", json=chat_body({}, LONG))
    expected = {**{key: body for key, body in live.items() if key in by_id}, "long": long_live.json()}
    assert len(expected) == len(IMPOSSIBLE) - len(SCHEMA_STATED) + 1
    for custom_id, body in expected.items():
        assert by_id[custom_id]["status_code"] == 400, (custom_id, by_id[custom_id])
        assert by_id[custom_id]["body"] == body, custom_id  # the live route's error, word for word


def test_an_http_batch_line_carries_the_live_routes_error(server: ServerProcess, http: httpx.Client, live,
                                                          tmp_path: Path) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        with write_jsonl(tmp_path / "in.jsonl", batch_lines()).open("rb") as f:
            file_id = client.files.create(file=f, purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 600
        while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)  # polling the batch's status, as a client does
        assert batch.status == "completed", batch
        records = [json.loads(line) for file_id in (batch.output_file_id, batch.error_file_id) if file_id
                   for line in client.files.content(file_id).text.splitlines()]
    assert_lines_are_the_live_errors(records, live, http)


def test_a_kev_batch_line_carries_the_live_routes_error(http: httpx.Client, live, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", batch_lines())
    config = config_file(tmp_path, {"core": {"max_context": MAX_CONTEXT}})
    done = run_batch(source, "-o", tmp_path / "out.jsonl", "--config", config, "--quiet")
    assert done.returncode == 1, done.stderr  # some lines failed; their error lines are in the output
    assert_lines_are_the_live_errors(read_output(tmp_path / "out.jsonl"), live, http)
