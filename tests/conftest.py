"""Shared fixtures: one real default-model engine per test session (loading takes seconds), and real `kev serve`
processes."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness import ServerProcess

import kev


@pytest.fixture(scope="session")
def default_model():
    """The default model and tokenizer, loaded once and shared by every engine in the session."""
    from kev.engine.engine_setup import load_model_and_tokenizer  # torch: only for tests that need the model

    # fp32 pinned: the shared engines compare logits with transformers; bf16 has its own tests.
    return load_model_and_tokenizer(kev.load_config({"core": {"precision": "fp32"}}))


@pytest.fixture(scope="module")
def make_engine(default_model):
    """Build an engine on the shared model with config overrides; closed at the end of the module that made it.
    (Session-long engines each kept their KV pool to the end: the suite's process grew past 15 GB and was
    OOM-killed on a 24 GiB machine running a second suite.)"""
    from kev.engine.engine_setup import build_parts

    engines: list[kev.Engine] = []

    def make(overrides: dict | None = None, record_logits: bool = False, background: bool = True) -> kev.Engine:
        # Generous timeouts: CI machines are slow and shared; timeouts have their own tests.
        # round_robin: a packed test wants its questions side by side in separate channels;
        # routing tests name their strategy.
        config = kev.load_config({"router": {"default_timeout_ms": 600_000, "strategy": "round_robin"},
                                  "core": {"precision": "fp32"}},
                                 overrides or {})
        model, tokenizer = default_model
        engine = kev.Engine(config, build_parts(config, model, tokenizer), record_logits=record_logits,
                            background=background)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """start_server(config, api_key=None, extra_args=None): servers started here stop (SIGTERM) at module end."""
    servers: list[ServerProcess] = []

    def start(config: dict[str, Any] | None = None, api_key: str | None = None,
              extra_args: list[str] | None = None) -> ServerProcess:
        server = ServerProcess(config or {}, tmp_path_factory.mktemp("kev-serve"), api_key, extra_args or [])
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        code = server.terminate()
        assert code == 0, f"kev serve exited with {code} on SIGTERM:\n{server.log()[-3000:]}"
