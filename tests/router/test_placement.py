"""Work-conserving placement on the real engine and the default strategy (issue 13, point 2): a question
waits only when every channel of its group is busy."""
from __future__ import annotations


def test_questions_never_wait_beside_idle_channels(make_engine):
    engine = make_engine({"router": {"strategy": "semantic_hash"}}, background=False)
    questions = ["What is the capital of France?", "Why is the sky blue?"] + ["Tell me a joke."] * 4  # n > 1 samples
    rid = engine.submit(questions, max_tokens=4)
    engine.step()  # one step: every question has started, none is queued behind another
    states = engine.channel_states()
    assert sum(s["state"] != "idle" for s in states) == 6 and sum(s["queued"] for s in states) == 0
    results = engine.wait(rid, 120)
    assert len({r.channel_id for r in results}) == 6
    jokes = [r for r in results if r.original_text == "Tell me a joke."]
    # moved off the bucket's channel
    assert len({r.hash_bucket for r in jokes}) == 1 and sum(r.rerouted for r in jokes) >= 3
    assert all(r.category == "other" and r.strategy == "semantic_hash" for r in results)
