"""The channel playground in real headless Chromium against a real `kev serve`.

What a person does: type questions (one with a tiny timeout), send them as one request,
watch each lane fill, verify isolation; and with an API key set, type the key first.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import REPO, ServerProcess

from kev.server.playground import PAGE_PATHS

pytestmark = [pytest.mark.service, pytest.mark.timeout(900)]

MAX_TOKENS = 12
QUESTIONS = ["What is the capital of France?", "用一句话介绍北京。"]
SLOW = "Count from one to one hundred, in words."  # gets a 1 ms timeout: it cannot finish, the others must
CONFIG = {"router": {"default_timeout_ms": 300_000}}  # no default timeout on a busy CPU; only the one we set
KEY = "playground-key-4711"
DOCS_SHOT = REPO / "docs" / "playground.png"


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    return start_server(CONFIG)


@pytest.fixture(scope="module")
def locked_server(start_server) -> ServerProcess:
    return start_server(CONFIG, api_key=KEY)


def ask(page: Any, rows: list[tuple[str, int | None]]) -> None:
    """Fill exactly these question rows (text, timeout_ms) and greedy options, the way a person would."""
    while page.locator("#rows .row").count() > len(rows):
        page.locator("#rows .q-remove").last.click()
    while page.locator("#rows .row").count() < len(rows):
        page.click("#add-row")
    for i, (text, timeout_ms) in enumerate(rows):
        row = page.locator("#rows .row").nth(i)
        row.locator(".q-text").fill(text)
        row.locator(".q-timeout").fill("" if timeout_ms is None else str(timeout_ms))
    page.fill("#max-tokens", str(MAX_TOKENS))
    page.fill("#temperature", "0")


def wait_for_lanes(page: Any, count: int) -> None:
    from playwright.sync_api import expect
    expect(page.locator(".lane")).to_have_count(count)
    expect(page.locator(".lane:not([data-finished])")).to_have_count(0)


def api_answers(server: ServerProcess, questions: list[str]) -> list[dict[str, Any]]:
    body = {"queries": questions, "max_tokens": MAX_TOKENS, "temperature": 0, "isolation": "strict"}
    response = httpx.post(f"{server.url}/v1/query", json=body, headers=server.headers, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_lanes_stream_each_answer_and_the_timeout_is_a_placeholder(server: ServerProcess, open_page,
                                                                   tmp_path: Path) -> None:
    from playwright.sync_api import expect
    page = open_page(server)
    expect(page.locator("#server-state")).to_have_attribute("data-state", "ready")
    ask(page, [(QUESTIONS[0], None), (QUESTIONS[1], None), (SLOW, 1)])
    with page.expect_response(lambda r: r.url.endswith("/v1/query")) as sent:
        page.click("#send")
    assert sent.value.headers["content-type"].startswith("text/event-stream"), "the page streams (SSE)"
    wait_for_lanes(page, 3)

    lanes = page.locator(".lane")
    for i, expected in enumerate(api_answers(server, QUESTIONS)):
        lane = lanes.nth(i)
        assert lane.get_attribute("data-status") == "ok"
        assert lane.locator(".lane-text").text_content() == expected["text"], f"lane {i + 1}"
        assert lane.locator(".lane-question").text_content() == QUESTIONS[i]
        audit = lane.locator(".lane-audit").text_content()
        assert f"{expected['completion_tokens']} completion" in audit and expected["finish_reason"] in audit
        assert expected["numerics_fingerprint"] in audit
        assert lane.locator(".lane-channel").text_content().removeprefix("channel ").isdigit()
    slow = lanes.nth(2)
    expect(slow).to_have_attribute("data-status", "timeout")
    expect(slow.locator(".lane-status")).to_have_text("timeout")
    assert "timeout" in slow.locator(".lane-audit").text_content()
    channels = {lanes.nth(i).locator(".lane-channel").text_content() for i in range(2)}
    assert len(channels) == 2, "two questions of one request answered in one channel"
    expect(page.locator("#pool .channel")).to_have_count(16)
    expect(page.locator("#last-step")).to_contain_text("in one forward")

    page.click("#verify")
    expect(page.locator(".lane-verify[data-state=identical]")).to_have_count(2)
    expect(slow.locator(".lane-verify")).to_have_attribute("data-state", "skipped")
    expect(page.locator("#run-summary")).to_contain_text("2 of 2")

    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("KEV_PLAYGROUND_SCREENSHOT") == "docs":  # refresh the picture in docs/playground.md
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_SHOT)


def test_page_asks_for_the_key_and_never_holds_it(locked_server: ServerProcess, open_page) -> None:
    from playwright.sync_api import expect
    with httpx.Client(base_url=locked_server.url) as anonymous:
        for path in sorted(PAGE_PATHS):  # the page is public, holds no secret; the API stays locked
            response = anonymous.get(path)
            assert response.status_code == 200 and KEY not in response.text, path
        assert anonymous.get("/v1/channels").status_code == 401
        assert anonymous.get("/v1/stats").status_code == 401

    page = open_page(locked_server)
    expect(page.locator("#server-state")).to_have_attribute("data-state", "locked")
    expect(page.locator("#api-key")).to_have_attribute("aria-invalid", "true")
    assert KEY not in page.content()
    ask(page, [(QUESTIONS[0], None)])
    page.click("#send")
    expect(page.locator("#form-message")).to_contain_text("401")
    expect(page.locator(".lane")).to_have_attribute("data-status", "error")

    sent: list[dict[str, str]] = []
    page.on("request", lambda req: req.url.endswith("/v1/query") and sent.append(req.headers))
    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    expect(page.locator("#server-state")).to_have_attribute("data-state", "ready")
    page.click("#send")
    wait_for_lanes(page, 1)
    expected = api_answers(locked_server, QUESTIONS[:1])[0]
    assert page.locator(".lane-text").text_content() == expected["text"]
    assert sent and all(headers.get("authorization") == f"Bearer {KEY}" for headers in sent)
    assert page.evaluate("() => sessionStorage.getItem('kev.apiKey')") is None, "kept in memory unless asked"
