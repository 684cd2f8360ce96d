"""Shadow checks: sampled questions are re-run alone and their results say whether they matched."""
from __future__ import annotations

import json

import torch

from tests.isolation.test_levels import QUESTIONS


def test_shadow_rate_one_verifies_every_answer(make_engine, tmp_path):
    path = tmp_path / "audit.jsonl"
    engine = make_engine({"isolation": {"shadow_rate": 1.0}, "audit": {"path": str(path)}})
    results = engine.generate(QUESTIONS, max_tokens=4, timeout=300)
    results += engine.generate(["Tell me a story."], temperature=0.8, seed=3, max_tokens=4, timeout=300)
    assert all(r.status == "ok" and r.isolation_verified is True for r in results)
    shadows = [json.loads(line) for line in path.read_text().splitlines() if '"kind": "shadow"' in line]
    assert len(shadows) == len(QUESTIONS) + 1 and all(s["isolation_verified"] for s in shadows)


def test_shadow_mismatch_raises_an_alert(make_engine):
    engine = make_engine({"isolation": {"shadow_rate": 1.0}})
    original_run = engine.runner.run
    calls = {"n": 0}

    def perturbed(meta):  # the packed run (not the solo re-run) gets one logit nudged
        logits = original_run(meta).clone()
        calls["n"] += 1
        if calls["n"] == 3:
            logits[0, 0] += 1e-3
        return logits
    engine.runner.run = perturbed
    results = engine.generate(QUESTIONS[:2], max_tokens=4, timeout=300)
    assert sorted(r.isolation_verified for r in results) == [False, True]
    assert engine.audit.alert_counts == {"shadow_mismatch": 1}


def test_no_shadow_by_default(make_engine):
    engine = make_engine()
    result = engine.generate(["Hi"], max_tokens=2, timeout=300)[0]
    assert result.isolation_verified is None and result.numerics_fingerprint
    assert torch.__version__  # the fingerprint covers the torch build
