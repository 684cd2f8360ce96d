"""Prompt-lookup drafts change no answer: every drafted row computes the logits plain decoding computes at that
position, so tokens and logits equal those of the same question decoded without drafts, alone and packed, greedy and
seeded, with stop strings, penalties and token limits landing inside an accepted draft."""
from __future__ import annotations

import json

import pytest
import torch

import kev
from kev.engine.drafts import DraftSettings, PromptLookup, parse_speculative, resolve
from kev.errors import QuestionError
from kev.engine.kv.block_manager import BlockManager

DOC = ("Invoice 4471 was issued by Harbor Lane Supplies to Maple Street Bakery on 12 March 2024. The total amount "
       "due is 1,284.50 euros, payable within 30 days to account NL91ABNA0417164300. Contact person: Jane Okafor, "
       "phone +31 20 555 0199.")
EXTRACTION = [f"{DOC}\nCopy the sentence that gives the total amount due.",
              f"{DOC}\nWho is the contact person and what is the phone number? Quote them exactly.",
              "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps again."]
OTHERS = ["Hi", "List three prime numbers.", "What is the capital of France? Answer in one word."]
OFF = {"method": "off"}
MAX_TOKENS = 24


def test_prompt_lookup_drafts_what_followed_the_latest_match_of_the_longest_suffix():
    lookup = PromptLookup(DraftSettings(max_draft=3, min_match=2, max_match=3))
    ids = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 2, 3]
    assert lookup.propose(ids, 10) == [7, 8, 6]  # (6, 2, 3) never occurred before; (2, 3) latest at 6..7
    assert lookup.propose(ids + [4], 10) == [5, 9, 2]  # (2, 3, 4) at 1..3, indexed as the ids grew
    assert lookup.propose(ids + [4], 2) == [5, 9]  # the caller's limit (token budget, rows budget)
    assert lookup.propose([5, 6, 7], 4) == []  # no earlier occurrence
    assert PromptLookup(DraftSettings(4, 1, 1)).propose([3, 4, 3], 4) == [4, 3]


def test_draft_length_follows_what_was_kept():
    lookup = PromptLookup(DraftSettings(max_draft=8, min_match=1, max_match=1))
    ids = list(range(20)) + [0]
    assert len(lookup.propose(ids, 20)) == 4  # starts at 4
    lookup.feedback(4, 4)
    assert len(lookup.propose(ids, 20)) == 8  # kept whole: doubled, up to max_draft
    lookup.feedback(8, 2)
    assert len(lookup.propose(ids, 20)) == 3  # rejected at the third: what was kept, plus one


def test_speculative_settings_take_kevs_and_vllms_names_and_name_bad_fields():
    assert parse_speculative({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3,
                              "prompt_lookup_max": 5}, "speculative") == {
        "method": "prompt_lookup", "max_draft": 5, "min_match": 3, "max_match": 5}
    assert parse_speculative(False, "x") == OFF and parse_speculative(None, "x") is None
    for bad, named in [({"method": "eagle"}, "speculative.method"), ({"max_draft": 0}, "speculative.max_draft"),
                       ({"lookahead": 2}, "unknown field"),
                       ({"max_draft": 3, "num_speculative_tokens": 3}, "not both")]:
        with pytest.raises(QuestionError, match=named.replace("(", r"\(").replace(")", r"\)")):
            parse_speculative(bad, "speculative")
    config = kev.load_config({"speculative": {"method": "prompt_lookup", "max_draft": 6}})
    assert resolve({"min_match": 5}, config.speculative) == DraftSettings(6, 5, 5)
    low_max = parse_speculative({"min_match": 4, "max_match": 2}, "s")
    assert resolve(low_max, config.speculative) == DraftSettings(6, 4, 4)  # max_match raised to min_match
    assert resolve(OFF, config.speculative) is None and resolve(None, kev.load_config({}).speculative) is None
    with pytest.raises(Exception, match="max_match"):
        kev.load_config({"speculative": {"min_match": 3, "max_match": 2}})


def test_trim_gives_back_only_the_blocks_past_the_tokens_kept():
    blocks = BlockManager(8, 4)
    blocks.ensure(0, 13)  # 4 blocks
    table = list(blocks.block_table(0))
    assert blocks.trim(0, 9) == table[3:]
    assert blocks.block_table(0) == table[:3] and blocks.num_free_blocks == 5
    assert blocks.trim(0, 12) == []
    blocks.check_integrity()


@pytest.fixture(scope="module")
def engines(make_engine):
    """Drafts on in the config (a small row budget would starve the packed test: it is raised); plain answers come from
    the same engine with drafts turned off per request."""
    config = {"speculative": {"method": "prompt_lookup", "max_draft": 6, "max_step_rows": 64, "policy": "rows"},
              "router": {"max_parallel_queries": 8, "channel_pool_size": 8}}
    return make_engine(config, record_logits=True)


@pytest.fixture(scope="module")
def plain(engines):
    return {q: engines.generate([q], max_tokens=MAX_TOKENS, speculative=OFF, timeout=600)[0]
            for q in EXTRACTION + OTHERS}


def same(result, reference) -> None:
    assert result.status == "ok", result.error
    assert result.token_ids == reference.token_ids, result.original_text
    assert result.text == reference.text and result.finish_reason == reference.finish_reason
    assert torch.equal(result.logits, reference.logits), f"logits differ for {result.original_text[:40]!r}"


def accepted(engine: kev.Engine) -> int:
    return engine.load().spec_accepted_tokens


def test_greedy_drafted_answers_equal_plain_alone_and_packed(engines, plain):
    before = accepted(engines)
    for q in EXTRACTION:
        same(engines.generate([q], max_tokens=MAX_TOKENS, timeout=600)[0], plain[q])
    alone = accepted(engines)
    assert alone > before, "no draft was accepted: the test proves nothing"
    mix = [EXTRACTION[2], OTHERS[0], EXTRACTION[0], OTHERS[1], EXTRACTION[1], OTHERS[2]]
    for q, result in zip(mix, engines.generate(mix, max_tokens=MAX_TOKENS, timeout=600)):
        same(result, plain[q])
    assert accepted(engines) > alone
    engines.parts.blocks.check_integrity()
    assert engines.parts.blocks.num_used_blocks == 0  # every question done: rejected rows' blocks came back


def test_seeded_sampling_draws_the_same_per_position(engines):
    options = dict(temperature=0.7, top_p=0.95, seed=11, max_tokens=MAX_TOKENS, timeout=600)
    before = accepted(engines)
    drafted = engines.generate(EXTRACTION, **options)
    assert accepted(engines) > before
    for q, result in zip(EXTRACTION, drafted):
        same(result, engines.generate([q], speculative=OFF, **options)[0])


def test_stop_strings_penalties_and_limits_inside_a_draft(engines, plain):
    """A stop string, the token limit or a penalty may fall anywhere in an accepted draft: the answer ends or samples
    exactly where plain decoding does, and the tokens after a stop are never part of it."""
    answer = plain[EXTRACTION[2]].text
    words = answer.split()
    stop = words[len(words) // 2] if len(words) > 2 else "fox"
    cases = [dict(stop=[stop]), dict(max_tokens=7), dict(presence_penalty=0.5, frequency_penalty=0.3),
             dict(logprobs=2)]
    for case in cases:
        options = {"max_tokens": MAX_TOKENS, **case, "timeout": 600}
        reference = engines.generate(EXTRACTION, speculative=OFF, **options)
        for result, ref in zip(engines.generate(EXTRACTION, **options), reference):
            same(result, ref)
            assert result.logprobs == ref.logprobs


def test_a_request_sets_its_own_drafts_in_vllms_shape(make_engine, engines, plain):
    """Drafts off in the config, on for one request (vLLM's speculative_config names)."""
    off_engine = make_engine({}, record_logits=True)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}
    [result] = off_engine.generate([EXTRACTION[0]], max_tokens=MAX_TOKENS, speculative=spec, timeout=600)
    same(result, plain[EXTRACTION[0]])
    load = off_engine.load()
    assert load.spec_drafts > 0 and 0 < load.spec_accepted_tokens <= load.spec_draft_tokens
    with pytest.raises(kev.errors.InvalidRequestError, match="speculative.method"):
        off_engine.submit(["Hi"], max_tokens=2, speculative={"method": "medusa"})


def test_a_full_step_proposes_no_draft(make_engine, plain):
    """Adaptive: max_step_rows 1 means every step is already at its row budget, so nothing is drafted."""
    engine = make_engine({"speculative": {"method": "prompt_lookup", "max_step_rows": 1}}, record_logits=True)
    same(engine.generate([EXTRACTION[0]], max_tokens=MAX_TOKENS, timeout=600)[0], plain[EXTRACTION[0]])
    assert engine.load().spec_drafts == 0


def test_metrics_carry_vllms_spec_decode_names():
    from kev.engine.stats import EngineLoad
    from kev.backend.metrics import ServerMetrics

    metrics = ServerMetrics("kev")
    metrics.refresh([], [], 0, {}, EngineLoad(spec_drafts=3, spec_draft_tokens=10, spec_accepted_tokens=4))
    text = metrics.render().decode()
    assert 'vllm:spec_decode_num_drafts_total{model_name="kev"} 3.0' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="kev"} 10.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="kev"} 4.0' in text
    assert "kev_spec_decode_acceptance_rate 0.4" in text
    assert (EngineLoad(spec_draft_tokens=2) + EngineLoad(spec_draft_tokens=3)).spec_draft_tokens == 5  # replicas add


def test_openai_and_kev_bodies_pass_their_speculative_field():
    from kev.wire.bodies.api_models import SubmitBody
    from kev.wire.bodies.openai_models import ChatCompletionBody

    body = ChatCompletionBody.model_validate({"model": "kev", "messages": [{"role": "user", "content": "Hi"}],
                                              "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    assert body.engine_sampling(8, {}).speculative == {"method": "ngram", "num_speculative_tokens": 3}
    sampling, _ = SubmitBody.model_validate({"queries": ["Hi"], "speculative": {"max_draft": 2}}).engine_submit()
    assert sampling.speculative == {"max_draft": 2}
    # One set of names per route, so the schema needs no `not` (schemathesis generates from it): Kev's names on the
    # Kev API, vLLM's in speculative_config; the other route's names are refused as unknown fields.
    with pytest.raises(Exception, match="num_speculative_tokens"):
        SubmitBody.model_validate({"queries": ["Hi"], "speculative": {"max_draft": 2, "num_speculative_tokens": 2}})
    with pytest.raises(Exception, match="max_draft"):
        ChatCompletionBody.model_validate({"model": "kev", "messages": [{"role": "user", "content": "Hi"}],
                                           "speculative_config": {"max_draft": 2}})
    for model in (SubmitBody, ChatCompletionBody):
        assert '"not"' not in json.dumps(model.model_json_schema())
    speculative_config = ChatCompletionBody.model_json_schema()["$defs"]["SpeculativeConfig"]
    assert speculative_config["additionalProperties"] is False
    assert set(speculative_config["properties"]) == {"method", "num_speculative_tokens", "prompt_lookup_min",
                                                     "prompt_lookup_max"}


def test_the_measured_policy_drafts_only_rows_that_pay():
    """DraftCosts: rows never measured are tried; measured ones are taken while their expected kept tokens pay for
    the time they add."""
    from kev.engine.draft_costs import DraftCosts

    costs = DraftCosts(acceptance=0.8)
    assert costs.affordable(1, 7) == 7  # nothing measured: the step measures it
    costs.record_step(1, 0.010)
    assert costs.affordable(1, 7) == 1  # the first row count not measured yet
    for rows, seconds in ((2, 0.011), (3, 0.012), (4, 0.030)):
        costs.record_step(rows, seconds)
    # E(1) = 0.8 and E(2) = 1.44 pay for 1.1x and 1.2x; E(3) = 1.95 does not pay for 3x
    assert costs.affordable(1, 3) == 2
    costs.record_step(2, 0.1)  # later, slower measurements (a busy machine) move the averages
    costs.record_step(3, 0.1)
    assert costs.step_seconds[2] == pytest.approx(0.011 + 0.2 * (0.1 - 0.011))
    assert costs.affordable(1, 3) == 0
    for _ in range(20):
        costs.record_verify(4, 0)
    assert costs.acceptance < 0.01 and costs.kept(4) < 0.01


def test_the_measured_policy_measures_a_refused_row_count_again():
    """A row count judged not to pay (here: measured on a busy machine) is tried again after REMEASURE_AFTER decode
    steps without it, and the quiet measurement then replaces the stale one and lets drafts back in."""
    from kev.engine.draft_costs import REMEASURE_AFTER, DraftCosts

    costs = DraftCosts(acceptance=0.8)
    costs.record_step(1, 0.010)
    costs.record_step(2, 0.050)  # busy: 5x for E(1) = 0.8 does not pay
    assert costs.affordable(1, 1) == 0
    for _ in range(REMEASURE_AFTER - 1):
        costs.record_step(1, 0.010)  # plain steps of one row only
    assert costs.affordable(1, 1) == 0
    costs.record_step(1, 0.010)
    assert costs.affordable(1, 1) == 1  # REMEASURE_AFTER steps since rows = 2 was measured: measure it again
    costs.record_step(2, 0.011)  # the machine is quiet again: the stale average is replaced, not moved
    assert costs.step_seconds[2] == 0.011 and costs.affordable(1, 1) == 1
    costs.record_step(2, 0.021)  # a fresh average moves as before
    assert costs.step_seconds[2] == pytest.approx(0.011 + 0.2 * 0.010)
