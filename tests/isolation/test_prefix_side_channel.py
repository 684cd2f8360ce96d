"""The prefix-cache timing side channel (vLLM's CVE-2025-46570, SPEC §2): under `loose`, caller B sending caller
A's private prefix gets it computed afresh, exactly as a decoy of the same length, so B's time to first token
cannot tell a right guess from a wrong one. A's own repeat does hit the cache: that is the signal B would see if
the cache crossed tenants, and the control that shows this test can see it.

The mechanism is compared exactly (prefix tokens computed, per-tenant hit counters); time only with a wide
margin (a hit is ~10-20x faster than a miss; the test asks for 2x), so a loaded machine does not flake it.
"""
from __future__ import annotations

import statistics

import pytest

from kev.config.server_config import DEFAULT_TENANT

PUBLIC = "You are a helpful assistant."
# ~400 tokens each, the same length: A's secret system prompt (a PIN inside), and B's wrong guess.
SECRET = "Internal notes for the support desk. The vault PIN is 4417. " + "Policy clause follows. " * 90
DECOY = "Internal notes for the support desk. The vault PIN is 9052. " + "Policy clause follows. " * 90
QUESTION = [{"role": "user", "content": "Say OK."}]
ROUNDS = 5


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine({"isolation": {"level": "loose", "kv_cache": "shared_readonly", "system_prompt": PUBLIC}})


def ask(engine, system: str, tenant: str) -> tuple[float, int]:
    """(time to first token in ms, shared-prefix tokens this request computed)."""
    before = engine.stats.num_prefix_tokens_computed
    result = engine.generate([QUESTION], system=system, tenant=tenant, max_tokens=1, timeout=600)[0]
    assert result.status == "ok", result.error
    return result.ttft_ms or 0.0, engine.stats.num_prefix_tokens_computed - before


@pytest.mark.slow
def test_another_tenants_prefix_costs_what_a_decoy_costs(engine) -> None:
    tokenizer = engine.tokenizer
    assert len(tokenizer.encode(SECRET)) == len(tokenizer.encode(DECOY)) > 300
    _, computed = ask(engine, SECRET, "alice")  # A's prompt, now in the cache for A
    assert computed > 300
    hits, probes, decoys = [], [], []
    for i in range(ROUNDS):  # fresh callers each round: a probe must not meet its own earlier probe
        hit, probe, decoy = ask(engine, SECRET, "alice"), ask(engine, SECRET, f"bob{i}"), ask(engine, DECOY, f"eve{i}")
        assert hit[1] == 0, "A's own repeat is a cache hit (the signal the attack looks for)"
        assert probe[1] == decoy[1] == computed, "B's guess is computed afresh, exactly as a decoy"
        hits.append(hit[0])
        probes.append(probe[0])
        decoys.append(decoy[0])
    hit_ms, probe_ms, decoy_ms = (statistics.median(x) for x in (hits, probes, decoys))
    print(f"median TTFT: A's repeat {hit_ms:.0f} ms, B's probe {probe_ms:.0f} ms, decoy {decoy_ms:.0f} ms")
    assert hit_ms < decoy_ms / 2, "control: a real hit is visibly faster, so the comparison below could fail"
    assert probe_ms > decoy_ms / 2, "B's probe must look like a miss"
    counts = engine.parts.scheduler.prefixes.store.loose_counts
    assert counts["alice"] == [ROUNDS + 1, ROUNDS]
    assert all(counts[f"bob{i}"] == [1, 0] for i in range(ROUNDS)), "B never hits A's prefix"


def test_the_operators_public_prefix_is_shared_by_every_tenant(engine) -> None:
    store = engine.parts.scheduler.prefixes.store
    _, computed = ask(engine, PUBLIC, DEFAULT_TENANT)  # the same text given by a caller is that caller's prefix
    assert computed > 0
    for tenant in ("carol", "dave"):  # no system: the operator's declared prompt
        assert engine.generate([QUESTION], tenant=tenant, max_tokens=1, timeout=600)[0].status == "ok"
    assert store.loose_counts["carol"][0] == store.loose_counts["dave"][0] == 1
    assert store.loose_counts["dave"][1] == 1, "the public prefix is a hit for anyone once computed"
