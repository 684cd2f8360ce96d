"""Shared fixtures: one real default-model engine per test session (loading takes seconds)."""
from __future__ import annotations

import pytest

import kev


@pytest.fixture(scope="session")
def default_model():
    """The default model and tokenizer, loaded once and shared by every engine in the session."""
    from kev.engine.engine_setup import load_model_and_tokenizer  # torch: only for tests that need the model

    return load_model_and_tokenizer(kev.load_config({}))


@pytest.fixture(scope="session")
def make_engine(default_model):
    """Build an engine on the shared model with config overrides; closed at session end."""
    from kev.engine.engine_setup import build_parts

    engines: list[kev.Engine] = []

    def make(overrides: dict | None = None, record_logits: bool = False, background: bool = True) -> kev.Engine:
        # Generous timeouts: CI machines are slow and shared; timeouts have their own tests.
        # round_robin: a packed test wants its questions side by side in separate channels;
        # routing tests name their strategy.
        config = kev.load_config({"aggregator": {"timeout_ms": 600_000}, "router": {"strategy": "round_robin"}},
                                 overrides or {})
        model, tokenizer = default_model
        engine = kev.Engine(config, build_parts(config, model, tokenizer), record_logits=record_logits, background=background)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
