"""Sampling options are one object: Engine.submit takes it, keywords build the same one, questions override it."""
from __future__ import annotations

import json

import pytest

import kev
from kev import SamplingParams
from kev.engine.sampling_params import split_submit

QUESTIONS = ["Name a colour.", {"text": "Count to three.", "max_tokens": 2}]


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


def test_the_object_and_its_keywords_give_the_same_answers(engine: kev.Engine) -> None:
    params = SamplingParams(max_tokens=5, temperature=0.8, top_k=20, seed=7, stop=("\n\n",))
    as_object = engine.wait(engine.submit(QUESTIONS, params), 300)
    as_keywords = engine.generate(QUESTIONS, max_tokens=5, temperature=0.8, top_k=20, seed=7, stop=["\n\n"],
                                  timeout=300)
    assert [r.token_ids for r in as_object] == [r.token_ids for r in as_keywords]
    assert [r.status for r in as_object] == ["ok", "ok"]
    assert as_object[1].completion_tokens == 2, "a question's own max_tokens overrides the request's object"
    assert as_object[0].completion_tokens <= 5


def test_the_engine_fills_in_its_default_max_tokens(make_engine) -> None:
    engine = make_engine({"router": {"default_max_tokens": 3}})
    result = engine.generate(["Tell me a long story."], SamplingParams(ignore_eos=True), timeout=300)[0]
    assert result.completion_tokens == 3


@pytest.mark.parametrize("call,fragment", [
    (lambda e: e.submit(["Hi"], SamplingParams(max_tokens=2), temperature=0.5), "temperature: set it in the"),
    (lambda e: e.submit(["Hi"], max_tokenz=2), "max_tokenz: not a submit option"),
    (lambda e: e.submit(["Hi"], SamplingParams(top_p=0.0)), "top_p: must be > 0"),
    (lambda e: e.submit(["Hi"], SamplingParams(logit_bias=((5, 500.0),))), r"logit_bias\[5\]"),
    (lambda e: e.submit(["Hi"], {"max_tokens": 2}), "sampling: must be a SamplingParams"),
])
def test_a_wrong_sampling_argument_names_itself(engine: kev.Engine, call, fragment: str) -> None:
    with pytest.raises(kev.InvalidRequestError, match=fragment):
        call(engine)


def test_json_round_trip_keeps_every_field() -> None:
    """What the cluster's work items carry: only the fields that differ, read back to the same object."""
    params = SamplingParams(max_tokens=9, temperature=0.5, stop=("a", "b"), logit_bias=((3, -1.5), (8, 2.0)),
                            logprobs=2, structured_outputs={"regex": "[ab]+"})
    as_json = params.to_json()
    assert "top_p" not in as_json, "defaults are left out"
    assert SamplingParams.from_options(json.loads(json.dumps(as_json))) == params
    assert SamplingParams().to_json() == {}


def test_split_submit_keeps_request_options_apart() -> None:
    sampling, options = split_submit(None, {"max_tokens": 4, "isolation": "strict", "timeout_ms": 10, "seed": 1})
    assert sampling == SamplingParams(max_tokens=4, seed=1)
    assert options == {"isolation": "strict", "timeout_ms": 10}
