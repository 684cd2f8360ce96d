"""The block manager's invariants are checked whenever the engine goes idle; a broken one is an isolation alert."""
from __future__ import annotations


def test_a_broken_block_count_is_an_alert_once_the_engine_is_idle(make_engine):
    engine = make_engine(background=False)
    assert engine.generate(["Hi"], max_tokens=2, timeout=600)[0].status == "ok"
    assert engine.alert_counts().get("block_integrity", 0) == 0
    blocks = engine.parts.blocks
    free_block = blocks._free[-1]  # the last to be handed out: no question here takes it
    blocks._ref_counts[free_block] += 1  # the bug being simulated: a free block that someone still counts
    try:
        assert engine.generate(["Hello"], max_tokens=2, timeout=600)[0].status == "ok"
        assert engine.alert_counts().get("block_integrity", 0) >= 1
    finally:
        blocks._ref_counts[free_block] -= 1
    assert not blocks.integrity_problems()


def test_the_background_loop_checks_when_it_goes_idle(make_engine):
    from harness import wait_until

    engine = make_engine()
    blocks = engine.parts.blocks
    with engine._lock:
        free_block = blocks._free[-1]  # the last to be handed out: no question here takes it
        blocks._ref_counts[free_block] += 1
    try:
        engine.generate(["Hi"], max_tokens=2, timeout=600)
        wait_until(lambda: engine.alert_counts().get("block_integrity", 0) >= 1, 300, "a block_integrity alert")
    finally:
        with engine._lock:
            blocks._ref_counts[free_block] -= 1
