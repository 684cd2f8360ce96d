"""A cancel that lands while a step's forward runs (sampling reads the plan's snapshot, not the live question)
never fails the step, and so never fails the questions beside the cancelled one."""
from __future__ import annotations

import pytest

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"],
          "additionalProperties": False}
KINDS = [{"json": PERSON}, {"regex": "[a-z]{3,40}"}, {"choice": ["yes", "no", "perhaps not"]},
         {"grammar": 'start: "Answer: " /[0-9]{1,6}/'}]
FREE = ["What is the capital of France?", "Name three colours."]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine({"router": {"max_parallel_queries": 8, "channel_pool_size": 8}})


def test_a_cancel_between_planning_and_sampling_changes_nothing_else(make_engine):
    """Deterministic: the cancel is made inside the forward, after the step was planned with the grammar."""
    engine = make_engine({"router": {"max_parallel_queries": 4, "channel_pool_size": 4}}, background=False)
    alone = engine.generate([FREE[0]], max_tokens=MAX_TOKENS, timeout=600)[0]
    plain = engine.submit([FREE[0]], max_tokens=MAX_TOKENS)
    constrained = engine.submit([{"text": "A person as JSON", "structured_outputs": KINDS[0]}], max_tokens=MAX_TOKENS)
    forward = engine.runner.run
    cancelled: list[bool] = []

    def forward_then_cancel(meta):  # the cancel lands while the step's forward runs, as from another thread
        logits = forward(meta)
        question = engine.requests[constrained].questions[0]
        if not cancelled and question.grammar is not None and question.output_ids:
            engine.cancel(constrained)
            cancelled.append(question.grammar is None)
        return logits

    engine.runner.run = forward_then_cancel  # type: ignore[method-assign]
    try:
        results = engine.wait(plain, timeout=600)
    finally:
        engine.runner.run = forward  # type: ignore[method-assign]
    assert cancelled == [True], "the cancel never landed mid-step"
    assert engine.wait(constrained, timeout=600)[0].status == "cancelled"
    assert results[0].status == "ok", results[0].error
    assert results[0].token_ids == alone.token_ids


def test_cancelling_constrained_questions_mid_answer_never_fails_a_neighbour(engine):
    """Many rounds on the background loop: constrained requests cancelled at varied moments while free ones run."""
    alone = {text: engine.generate([text], max_tokens=MAX_TOKENS, timeout=600)[0].token_ids for text in FREE}
    for round_ in range(16):
        free = engine.submit(FREE, max_tokens=MAX_TOKENS)
        kind = KINDS[round_ % len(KINDS)]
        constrained = engine.submit([{"text": "Answer in the format asked.", "structured_outputs": kind}] * 2,
                                    max_tokens=MAX_TOKENS)
        events = engine.stream(constrained, timeout=600)
        for _ in range(round_ % 4):  # cancel after 0..3 events: before, during and between steps
            if next(events, None) is None:
                break
        engine.cancel(constrained)
        for result in engine.wait(free, timeout=600):
            assert result.status == "ok", f"round {round_}: {result.error}"
            assert result.token_ids == alone[FREE[result.index]], f"round {round_}: answer changed"
        assert {r.status for r in engine.wait(constrained, timeout=600)} <= {"ok", "cancelled"}
