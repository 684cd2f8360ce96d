"""Router, budget and audit keys: defaults per SPEC, and every contradiction named at load."""
from __future__ import annotations

import pytest

import kev


def test_defaults_follow_the_spec():
    config = kev.load_config({})
    assert config.router.strategy == "semantic_hash" and config.router.overflow_policy == "wait"
    assert config.router.normalize and config.audit.path is None and config.audit.level == "summary"


@pytest.mark.parametrize("overrides, key", [
    ({"router": {"stratgy": "round_robin"}}, "kev.router.stratgy"),
    ({"router": {"strategy": "random"}}, "kev.router.strategy"),
    ({"router": {"overflow_policy": "drop"}}, "kev.router.overflow_policy"),
    ({"router": {"num_buckets": 48}}, "router.num_buckets"),
    ({"router": {"breaker_threshold": 8, "channel_queue_depth": 8}}, "router.breaker_threshold"),
    ({"router": {"length_tiers": [512, 64]}}, "router.length_tiers"),
    ({"router": {"strategy": "length_aware", "length_tiers": list(range(1, 10))}}, "router.length_tiers"),
    ({"router": {"categories": {"refund": ["退款("]}}}, "router.categories.refund"),
    ({"router": {"categories": {"other": ["x"]}}}, "router.categories.other"),
    ({"router": {"epsilon": 0}}, "kev.router.epsilon"),
    ({"router": {"default_max_tokens": 100, "max_tokens_cap": 10}}, "router.max_tokens_cap"),
    ({"router": {"default_timeout_ms": 5000, "timeout_ms_cap": 1000}}, "router.timeout_ms_cap"),
    ({"audit": {"level": "verbose"}}, "kev.audit.level"),
    ({"audit": {"file": "x.jsonl"}}, "kev.audit.file"),
])
def test_contradictions_fail_at_load_naming_the_key(overrides, key):
    with pytest.raises(kev.ConfigError, match=key.replace(".", r"\.")):
        kev.load_config(overrides)


def test_categories_and_tiers_that_fit():
    config = kev.load_config({"router": {"strategy": "length_aware", "length_tiers": [64],
                                         "categories": {"refund": ["退款"], "address": ["地址"]}}})
    assert list(config.router.categories) == ["refund", "address"] and config.router.length_tiers == (64,)


def test_aggregator_timeout_ms_is_a_deprecated_alias_of_router_default_timeout_ms():
    with pytest.warns(DeprecationWarning, match="router.default_timeout_ms"):
        config = kev.load_config({"aggregator": {"timeout_ms": 5000}})
    assert config.router.default_timeout_ms == 5000 and config.aggregator.mode == "slot_map"
    with pytest.raises(kev.ConfigError, match="aggregator.timeout_ms"):
        kev.load_config({"aggregator": {"timeout_ms": 5000}, "router": {"default_timeout_ms": 10}})
