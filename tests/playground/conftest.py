"""Playground tests: a real `kev serve` and Debian's headless Chromium, driven by Playwright (never its own browser)."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import ServerProcess

CHROMIUM = Path("/usr/bin/chromium")
# No network, no background services: the page must work from what kev serve alone sends.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
WAIT_MS = 300_000  # two shared CPU cores: a step can take a second when others run their tests


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing: `apt-get install chromium chromium-driver` (make install-browser)"
        if os.environ.get("CI") == "true":  # .ci/run installs it; a skip there would hide a broken install step
            pytest.fail(missing)
        pytest.skip(missing)
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' brings playwright")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        sync_api.expect.set_options(timeout=WAIT_MS)
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Callable[[ServerProcess], Any]]:
    """open_page(server): a fresh tab on the playground; afterwards, no script error and no request elsewhere."""
    contexts: list[Any] = []
    errors: list[str] = []
    foreign: list[str] = []

    def open_(server: ServerProcess) -> Any:
        context = browser.new_context(viewport={"width": 1366, "height": 860}, locale="zh-CN")
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
        page.on("request", lambda req: req.url.startswith(server.url + "/") or req.url.startswith("data:")
                or foreign.append(req.url))
        page.goto(server.url + "/")
        return page

    yield open_
    for context in contexts:
        context.close()
    assert not foreign, f"the page reached beyond kev serve: {foreign}"
    # A 401 the page was meant to get shows in the console as a failed resource; anything else is a bug.
    assert not [e for e in errors if "401" not in e], errors
