"""Every alert fires on an injected fault, fails the affected questions loudly, and the engine keeps serving."""
from __future__ import annotations

import json

import pytest
import torch

from tests.isolation.test_levels import QUESTIONS, level_config

MAX_TOKENS = 4


@pytest.fixture()
def audited(make_engine, tmp_path):
    def make(level: str = "strict", **core):
        path = tmp_path / f"audit-{level}.jsonl"
        engine = make_engine({**level_config(level, **core), "audit": {"path": str(path), "level": "full"}})
        return engine, path
    return make


def records(path, kind=None):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if kind is None or r["kind"] == kind]


def before_audit(engine, hook):
    """Fault injection: hook(meta) runs on each step's metadata just before the isolation audit reads it."""
    check = engine.guard.check
    engine.guard.check = lambda meta: (hook(meta), check(meta))[1]


def one_shot(engine, corrupt):
    """Run corrupt(meta) on the first step that has at least two channels decoding."""
    fired = []

    def hook(meta):
        decoding = [s for s in meta.spans if s.q_len == 1 and s.channel_id >= 0]
        if len(decoding) >= 2 and not fired:
            fired.append(True)
            corrupt(meta, decoding)
    before_audit(engine, hook)


def assert_still_serving(engine, reference):
    again = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    assert [r.token_ids for r in again] == [r.token_ids for r in reference]


def test_clean_run_logs_steps_blocks_and_no_alerts(audited):
    engine, path = audited("shared")
    results = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    assert all(r.status == "ok" for r in results)
    steps = records(path, "step")
    assert steps and all(s["cross_channel_pairs"] == 0 for s in steps)
    assert any(s["prefix_pairs"] > 0 for s in steps), "channels attend to the shared prefix"
    assert all("blocks" in c for s in steps for c in s["channels"])
    owners = {r["owner"] for r in records(path, "alloc")}
    assert any(o < 0 for o in owners) and any(o >= 0 for o in owners), "prefix and channel allocations logged"
    assert records(path, "release") and not records(path, "alert")


def test_cross_channel_key_fails_both_channels(audited):
    engine, path = audited()
    reference = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)

    def leak(meta, decoding):
        a, b = decoding[0], decoding[1]
        a.kv_slots = torch.cat([a.kv_slots, b.kv_slots[:1]])
    one_shot(engine, leak)
    results = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    failed = [r for r in results if r.status == "error"]
    assert len(failed) == 2 and all("cross_channel_visible" in r.error for r in failed)
    for r, ref in zip(results, reference):
        if r.status == "ok":
            assert r.token_ids == ref.token_ids, "bystanders are unaffected"
    assert [a["alert"] for a in records(path, "alert")] == ["cross_channel_visible"]
    assert_still_serving(engine, reference)


def test_block_in_two_private_tables(audited):
    engine, path = audited()
    reference = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    blocks = engine.parts.blocks

    def share_a_block(meta, decoding):
        a, b = decoding[0].channel_id, decoding[1].channel_id
        stolen = blocks.block_table(b)[0]
        blocks._tables[a].append(stolen)  # the bug being simulated: a table that points into another channel
        blocks._ref_counts[stolen] += 1
    one_shot(engine, share_a_block)
    results = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    assert sum(r.status == "error" for r in results) == 2
    assert "block_in_two_tables" in {a["alert"] for a in records(path, "alert")}
    blocks.check_integrity()
    assert_still_serving(engine, reference)


def test_write_to_read_only_prefix_block(audited):
    engine, path = audited("shared")
    reference = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)

    def overwrite_prefix(meta, decoding):
        shared_block = min(engine.parts.blocks.read_only)
        meta.slot_mapping[0] = shared_block * engine.parts.blocks.block_size
    one_shot(engine, overwrite_prefix)
    results = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    assert sum(r.status == "error" for r in results) == 1
    assert [a["alert"] for a in records(path, "alert")] == ["write_to_readonly_block"]
    assert_still_serving(engine, reference)


def test_chunk_boundary_inside_prefix(audited):
    engine, path = audited("shared")

    fired = []

    def hook(meta):
        prefill = [s for s in meta.spans if s.channel_id >= 0 and s.q_len > 1]
        if prefill and not fired:
            fired.append(True)
            prefill[0].prefix_len = prefill[0].ctx_len
    before_audit(engine, hook)
    results = engine.generate(QUESTIONS, max_tokens=MAX_TOKENS, timeout=300)
    assert sum(r.status == "error" for r in results) == 1
    assert [a["alert"] for a in records(path, "alert")] == ["chunk_boundary_in_prefix"]


def test_context_overflow_and_truncation(audited):
    engine, path = audited("strict", max_context=96)
    results = engine.generate(["word " * 200, "Count from one to one hundred in words."], max_tokens=200,
                              ignore_eos=True, timeout=300)
    assert results[0].status == "error" and "max_context" in results[0].error
    assert results[1].status == "ok" and results[1].finish_reason == "length"
    assert results[1].prompt_tokens + results[1].completion_tokens == 96
    kinds = [a["alert"] for a in records(path, "alert")]
    assert kinds == ["truncation_near_boundary"]  # the prompt over the context is the caller's: a reject, no alert
