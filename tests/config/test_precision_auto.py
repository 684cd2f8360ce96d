"""core.precision auto: bf16 where the CPU computes it natively, fp32 elsewhere; explicit values stand."""
from __future__ import annotations

import kev
from kev.config import precision


def test_explicit_precision_is_kept():
    assert kev.load_config({"core": {"precision": "fp32"}}).core.resolved_precision == "fp32"


def test_auto_follows_the_cpu_flags(monkeypatch):
    precision.pick_precision.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert kev.load_config({"core": {"device": "cpu"}}).core.resolved_precision == "bf16"
    precision.pick_precision.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ())
    assert kev.load_config({"core": {"device": "cpu"}}).core.resolved_precision == "fp32"
    assert "no native bf16" in precision.describe("auto", "cpu")
    precision.pick_precision.cache_clear()


def test_auto_is_the_default():
    assert kev.load_config({}).core.precision == "auto"
