"""Logprobs, prompt logprobs and structured output, per channel: a batch changes none of their bits."""
from __future__ import annotations

import codecs
import json
import math

import jsonschema
import pytest
import torch

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"], "additionalProperties": False}
FREE = ["Hi", "What is the capital of France? Answer in one word.", "解释一下什么是KV Cache"]
LONG_PROMPT = ("The sky looks blue during the day because molecules in the air scatter short wavelengths of "
               "sunlight more strongly than long ones; at sunset the light travels through more air.")
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def engine(make_engine):
    # Small prefill chunks: a long prompt is scored over several chunks (each returns all its rows).
    return make_engine({"core": {"prefill_chunk": 16, "max_step_tokens": 64},
                        "router": {"max_parallel_queries": 8, "channel_pool_size": 12}}, record_logits=True)


def constrained(text: str, schema: dict) -> dict:
    return {"text": text, "structured_outputs": {"json": schema}, "max_tokens": 48}


def solo(engine, question, **options):
    return engine.generate([question], timeout=600, **options)[0]


def test_mixed_batch_unconstrained_equal_solo_and_constrained_validate(engine):
    """Some questions carry schemas, some do not (SGLang #2414, vllm-gaudi #1199): the free ones stay bit-identical."""
    questions = [FREE[0], constrained("Describe a person as JSON.", PERSON), FREE[1],
                 constrained("Give a city and its weather as JSON.", CITY), FREE[2],
                 {"text": "Is water wet?", "structured_outputs": {"choice": ["yes", "no"]}}]
    results = engine.generate(questions, max_tokens=MAX_TOKENS, logprobs=3, timeout=600)
    for question, result in zip(questions, results):
        assert result.status == "ok", result.error
        if isinstance(question, str):
            alone = solo(engine, question, max_tokens=MAX_TOKENS, logprobs=3)
            assert result.token_ids == alone.token_ids
            assert torch.equal(result.logits, alone.logits)
            assert result.logprobs == alone.logprobs
        elif "choice" in question["structured_outputs"]:
            assert result.text in ("yes", "no")
        else:
            assert result.finish_reason == "stop", result.text
            jsonschema.validate(json.loads(result.text), question["structured_outputs"]["json"])
    request = next(iter(engine.requests.values()))
    assert all(q.grammar is None for r in engine.requests.values() for q in r.questions.values()), \
        "a finished question's channel still holds grammar state"
    assert request.questions  # the bookkeeping above looked at real questions


def test_constrained_answer_equals_its_solo_run(engine):
    question = constrained("Describe a person as JSON.", PERSON)
    packed = engine.generate([FREE[1], question, FREE[0]], max_tokens=MAX_TOKENS, timeout=600)[1]
    alone = solo(engine, question, max_tokens=MAX_TOKENS)
    assert packed.token_ids == alone.token_ids and torch.equal(packed.logits, alone.logits)


def test_logprobs_shape_and_greedy_choice(engine):
    result = solo(engine, FREE[1], max_tokens=6, logprobs=4)
    assert [e["token_id"] for e in result.logprobs] == result.token_ids
    for entry, row in zip(result.logprobs, result.logits):
        top = entry["top_logprobs"]
        assert len(top) == 4 and top[0]["token_id"] == entry["token_id"]  # greedy picks the most likely
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert entry["logprob"] == pytest.approx(float(torch.log_softmax(row, -1)[entry["token_id"]]), abs=0)
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"] or "\ufffd" in entry["token"]
    assert sum(math.exp(t["logprob"]) for t in top) <= 1.0 + 1e-6


def test_logprobs_are_before_temperature(engine):
    """Sampling at temperature 2 does not change the reported distribution."""
    greedy = solo(engine, FREE[1], max_tokens=1, logprobs=2)
    hot = solo(engine, FREE[1], max_tokens=1, logprobs=2, temperature=2.0, top_p=0.5, seed=1)
    assert hot.logprobs[0]["top_logprobs"] == greedy.logprobs[0]["top_logprobs"]


def test_prompt_logprobs_batch_equals_solo_over_chunks(engine):
    question = {"prompt": LONG_PROMPT, "max_tokens": 0, "prompt_logprobs": True, "logprobs": 2}
    alone = solo(engine, question)
    assert alone.status == "ok" and alone.finish_reason == "length" and alone.token_ids == []
    ids = engine.tokenizer.encode(LONG_PROMPT)
    assert len(ids) >= 32  # two or more 16-token chunks
    assert [e["token_id"] for e in alone.prompt_logprobs] == ids
    assert alone.prompt_logprobs[0]["logprob"] is None and all(e["logprob"] < 0 for e in alone.prompt_logprobs[1:])
    packed = engine.generate([FREE[0], question, FREE[2]], max_tokens=MAX_TOKENS, timeout=600)[1]
    assert packed.prompt_logprobs == alone.prompt_logprobs


def test_prompt_logprobs_agree_with_generated_logprobs(engine):
    """Scoring a generated answer as a prompt gives back (to float tolerance) the logprobs it was generated with."""
    prompt_ids = engine.tokenizer.encode("Count from one to five: one,")
    generated = solo(engine, {"prompt_ids": prompt_ids, "max_tokens": 6, "logprobs": 0, "ignore_eos": True})
    scored = solo(engine, {"prompt_ids": prompt_ids + generated.token_ids, "max_tokens": 0, "prompt_logprobs": True})
    tail = [e["logprob"] for e in scored.prompt_logprobs[len(prompt_ids):]]
    assert tail == pytest.approx([e["logprob"] for e in generated.logprobs], abs=2e-4)


def test_scoring_and_grammar_input_errors_name_the_field(engine):
    results = engine.generate([{"text": "a", "max_tokens": 0},
                               {"text": "a", "structured_outputs": {"json": {"type": "nonsense"}}},
                               {"text": "a", "structured_outputs": {"regex": "[a-"}},
                               {"prompt_ids": [1, 2, 10**7]}, {"text": "a", "logprobs": 21}], timeout=60)
    errors = [r.error or "" for r in results]
    assert errors[0].startswith("queries[0].max_tokens: must be >= 1")
    assert errors[1].startswith("queries[1].structured_outputs: ") and "nonsense" in errors[1]
    assert errors[2].startswith("queries[2].structured_outputs: ") and "regex" in errors[2]
    assert errors[3].startswith("queries[3].prompt_ids[2]: token id 10000000 is outside the vocabulary")
    assert errors[4].startswith("queries[4].logprobs: at most 20")


def test_verify_compare_catches_logprobs_that_differ():
    """kev verify's comparison looks at logprobs too, not only tokens and logits."""
    from kev.results.result import Result
    from kev.isolation.verify import compare

    logits = torch.zeros(1, 4)
    entry = {"token_id": 1, "token": "a", "bytes": [97], "logprob": -0.5, "top_logprobs": []}
    solo_run = Result("r", 0, token_ids=[1], logits=logits, logprobs=[entry], prompt_logprobs=[entry])
    same = Result("r", 0, token_ids=[1], logits=logits.clone(), logprobs=[dict(entry)], prompt_logprobs=[dict(entry)])
    assert compare(same, solo_run)[0]
    moved = Result("r", 0, token_ids=[1], logits=logits.clone(), logprobs=[{**entry, "logprob": -0.50001}],
                   prompt_logprobs=[entry])
    assert compare(moved, solo_run)[2] == "logprobs differ in channel None"
    scored = Result("r", 0, token_ids=[1], logits=logits.clone(), logprobs=[entry], prompt_logprobs=[])
    assert compare(scored, solo_run)[2] == "prompt logprobs differ in channel None"


def test_schema_compilation_has_a_time_limit(engine):
    """A compile that does not finish in time is the question's error; the engine goes on."""
    import threading

    from kev.errors import QuestionError
    from kev.engine.structured import GrammarCompiler

    release = threading.Event()
    compiler = GrammarCompiler(engine.tokenizer, engine.runner.model.config.vocab_size, [2], compile_seconds=0.05)
    compiler._check = lambda grammar: release.wait() and ""  # a compile that never ends by itself
    try:
        with pytest.raises(QuestionError, match=r"^response_format: compiling the constraint took longer than 0.05 s"):
            compiler.compile({"json": PERSON}, "response_format")
    finally:
        release.set()
    assert compiler.compile({"json": PERSON}, "response_format").grammar  # a real compile is well inside a limit



def test_a_broken_grammar_ends_its_own_question_only(make_engine):
    """If a channel's matcher fails, that question ends in error; the step and its neighbours go on."""
    engine = make_engine(background=False)  # no step runs before the test breaks the matcher
    rid = engine.submit([FREE[0], {"text": "Is water wet?", "structured_outputs": {"choice": ["yes", "no"]}}],
                        max_tokens=8, timeout_ms=600_000)
    broken = engine.requests[rid].questions[1]
    broken.grammar.matcher.consume_token(engine.tokenizer.encode("zzz")[0])  # not allowed: the matcher errs
    results = engine.wait(rid, timeout=600)
    assert results[1].status == "error" and results[1].error_field == "queries[1].structured_outputs"
    assert results[1].error.startswith("queries[1].structured_outputs: the constraint allows no text after 0 tokens")
    alone = solo(engine, FREE[0], max_tokens=8)
    assert results[0].status == "ok" and results[0].token_ids == alone.token_ids


def test_logit_bias_and_penalties_act_on_their_own_channel_only(engine):
    forced = engine.tokenizer.encode(" banana")[0]
    biased = {"text": "Name a colour.", "logit_bias": {str(forced): 100}, "max_tokens": 3, "ignore_eos": True}
    penalised = {"prompt": "1, 1, 1, 1, 1, 1,", "presence_penalty": 2.0, "frequency_penalty": 2.0, "max_tokens": 6}
    results = engine.generate([FREE[1], biased, penalised, FREE[0]], max_tokens=MAX_TOKENS, logprobs=1, timeout=600)
    assert results[1].token_ids == [forced] * 3
    raw = torch.log_softmax(results[1].logits[0], -1)  # the recorded logits are the model's, before the bias
    assert results[1].logprobs[0]["logprob"] == float(raw[forced])  # logprobs stay the model's own
    plain = solo(engine, {**penalised, "presence_penalty": 0.0, "frequency_penalty": 0.0})
    assert results[2].token_ids != plain.token_ids
    assert results[2].token_ids == solo(engine, penalised).token_ids
    for i, text in ((0, FREE[1]), (3, FREE[0])):
        alone = solo(engine, text, max_tokens=MAX_TOKENS, logprobs=1)
        assert results[i].token_ids == alone.token_ids and torch.equal(results[i].logits, alone.logits)
    bad = engine.generate([{"text": "a", "logit_bias": {"99999999": 1}}, {"text": "a", "logit_bias": {"5": 101}},
                           {"text": "a", "presence_penalty": 3}], timeout=60)
    assert bad[0].error.startswith("queries[0].logit_bias: token id 99999999 is outside the vocabulary")
    assert bad[1].error.startswith("queries[1].logit_bias['5']: must be a number in [-100.0, 100.0]")
    assert bad[2].error.startswith("queries[2].presence_penalty: must be a number in [-2.0, 2.0]")


def test_logprob_bytes_rebuild_the_text_even_across_split_characters(engine):
    result = solo(engine, {"prompt": "中国的首都是北京。日本的首都是"}, max_tokens=8, logprobs=0)
    eos = set(engine.tokenizer.eos_token_ids)
    joined = b"".join(bytes(e["bytes"]) for e in result.logprobs if e["token_id"] not in eos)
    # A length cut inside a character leaves its first bytes in the logprobs but out of the text (no U+FFFD):
    # the text is the joined bytes up to the last whole character.
    whole = codecs.getincrementaldecoder("utf-8")().decode(joined, final=False)
    assert whole == result.text and "\ufffd" not in result.text and any(ord(ch) > 0x2E80 for ch in result.text)
    assert len(joined) - len(whole.encode()) < 4
