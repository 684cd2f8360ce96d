"""Scoring and structure over HTTP: logprobs, echo, token-id prompts, tokenizer routes, structured output,
and refusals of what Kev does not support; driven by the official `openai` client where it can be."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.service

MODEL = "smollm2-135m-instruct"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def tokenize(kev_http: httpx.Client, text: str) -> list[int]:
    response = kev_http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
    return body["tokens"]


def test_tokenizer_routes_round_trip(kev_http: httpx.Client) -> None:
    ids = tokenize(kev_http, "Hello, world! 你好")
    assert kev_http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "Hello, world! 你好"}
    info = kev_http.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] and "pad_token" in info
    assert "im_start" in info["chat_template"]
    chat = kev_http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["tokens"][0] == tokenize(kev_http, "<|im_start|>")[0]
    bad = kev_http.post("/detokenize", json={"tokens": [1, 99_999_999]})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "tokens[1]"


def test_echo_scores_the_prompt_like_the_kev_api(openai_client: openai.OpenAI, kev_http: httpx.Client) -> None:
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 0 or 1."""
    ids = tokenize(kev_http, "The capital of France is Paris.")
    scored = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1,
                                              temperature=0)
    choice = scored.choices[0]
    lp = choice.logprobs
    assert choice.text == "The capital of France is Paris."
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(t < 0 for t in lp.token_logprobs[1:])
    assert all(lp.tokens[i] in lp.top_logprobs[i] and len(lp.top_logprobs[i]) <= 2 for i in range(1, len(ids)))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    kev = kev_http.post("/v1/query", json={"queries": [{"prompt_ids": ids}], "max_tokens": 0, "prompt_logprobs": True,
                                           "logprobs": 1}).json()["results"][0]
    assert [e["logprob"] for e in kev["prompt_logprobs"]] == lp.token_logprobs
    one = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    assert one.choices[0].logprobs.token_logprobs[:-1] == lp.token_logprobs  # the prompt's part is the same
    assert len(one.choices[0].logprobs.tokens) == len(ids) + 1


def test_chat_logprobs_shape(openai_client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    completion = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                       logprobs=True, top_logprobs=3)
    content = completion.choices[0].logprobs.content
    assert "".join(c.token for c in content).startswith(completion.choices[0].message.content[:3])
    for token in content:
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].token == token.token  # greedy
        assert token.logprob == token.top_logprobs[0].logprob and isinstance(token.bytes, list)
    plain = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == completion.choices[0].message.content


def test_stream_carries_logprobs(openai_client: openai.OpenAI) -> None:
    stream = openai_client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=5, temperature=0, logprobs=2,
                                              stream=True)
    tokens = [t for chunk in stream for c in chunk.choices if c.logprobs for t in c.logprobs.tokens]
    assert len(tokens) == 5


@pytest.mark.parametrize("prompt, n", [("Hi", 1), (["Hi", "Say yes."], 2), ([1, 2, 3], 1), ([[1, 2], [3, 4, 5]], 2)])
def test_all_four_prompt_shapes(openai_client: openai.OpenAI, prompt, n: int) -> None:
    completion = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert len(completion.choices) == n and all(c.finish_reason for c in completion.choices)


@pytest.mark.parametrize("prompt, field", [([5, 10**8, 6], "prompt[1]"), ([[5], [6, 7, 10**8]], "prompt[1][2]")])
def test_token_ids_outside_the_vocabulary_name_the_index(openai_client: openai.OpenAI, prompt, field: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert err.value.body["field"] == field and "outside the vocabulary" in err.value.body["message"]


def test_response_format_json_schema(openai_client: openai.OpenAI) -> None:
    completion = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(completion.choices[0].message.content), PERSON)
    anything = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A JSON object."}], max_tokens=48, temperature=0,
        response_format={"type": "json_object"})
    answer = anything.choices[0]
    assert answer.finish_reason == "length" or isinstance(json.loads(answer.message.content), dict)


def test_guided_choice_regex_and_structured_outputs(openai_client: openai.OpenAI, kev_http: httpx.Client) -> None:
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is fire hot?"}],
                                                 max_tokens=8, temperature=0,
                                                 extra_body={"guided_choice": ["yes", "no"]})
    assert chat.choices[0].message.content in ("yes", "no")
    text = openai_client.completions.create(model=MODEL, prompt="Year of the moon landing:", max_tokens=8,
                                            temperature=0, extra_body={"guided_regex": "19[0-9]{2}"})
    assert text.choices[0].text.startswith("19") and len(text.choices[0].text) == 4
    vllm = openai_client.completions.create(model=MODEL, prompt="Pick:", max_tokens=8, temperature=0,
                                            extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    assert vllm.choices[0].text in ("red", "blue")
    mixed = kev_http.post("/v1/query", json={"queries": ["Hi", {"text": "Is ice cold?",
                                                                "structured_outputs": {"choice": ["yes", "no"]}}],
                                             "max_tokens": 8, "temperature": 0}).json()["results"]
    assert mixed[1]["text"] in ("yes", "no") and mixed[0]["status"] == "ok"


@pytest.mark.parametrize("response_format, reason", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "nonsense"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(["}}}, "regex"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "is required"),
])
def test_invalid_schema_is_a_400_naming_response_format(openai_client: openai.OpenAI, response_format,
                                                        reason: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                              response_format=response_format)
    assert err.value.body["field"].startswith("response_format") and reason in err.value.body["message"]


@pytest.mark.parametrize("extra, field", [
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),  # the legacy form (tools: test_tool_calling)
    ({"logit_bias": {"99999999": 5}}, "logit_bias"), ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"best_of": 1, "n": 2}, "best_of"),
    ({"best_of": 3, "stream": True}, "best_of"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
])
def test_unsupported_chat_fields_are_refused_by_name(kev_http: httpx.Client, extra: dict, field: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}
    response = kev_http.post("/v1/chat/completions", json=body)
    assert 400 <= response.status_code < 500 and response.json()["error"]["field"] == field, response.text


@pytest.mark.parametrize("extra, field", [({"suffix": "end"}, "suffix"), ({"max_tokens": 0}, "max_tokens"),
                                          ({"logprobs": 21}, "logprobs"), ({"echo": True, "stream": True}, "echo")])
def test_unsupported_completion_fields_are_refused_by_name(kev_http: httpx.Client, extra: dict, field: str) -> None:
    response = kev_http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2, **extra})
    assert 400 <= response.status_code < 500 and response.json()["error"]["field"] == field, response.text


def test_no_op_values_of_unsupported_fields_are_accepted(openai_client: openai.OpenAI) -> None:
    completion = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                       max_tokens=2, presence_penalty=0, frequency_penalty=0, n=2,
                                                       extra_body={"best_of": 2})
    assert len(completion.choices) == 2


def test_best_of_answers_the_most_likely_candidates(openai_client: openai.OpenAI) -> None:
    """best_of 4, n 2: the same four seeded candidates as n 4, of which the two with the highest total logprob."""
    args = {"model": MODEL, "prompt": "My favourite colour is", "max_tokens": 4, "temperature": 1.0, "seed": 7}
    every = openai_client.completions.create(n=4, logprobs=0, **args)
    ranked = sorted(every.choices, key=lambda c: (-sum(c.logprobs.token_logprobs), c.index))
    best = openai_client.completions.create(n=2, extra_body={"best_of": 4}, **args)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1] and all(c.logprobs is None for c in best.choices)
    assert best.usage.completion_tokens == every.usage.completion_tokens  # every candidate counts


def test_logit_bias_and_penalties(openai_client: openai.OpenAI, kev_http: httpx.Client) -> None:
    forced = tokenize(kev_http, " banana")[0]
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                                 max_tokens=3, temperature=0, logit_bias={str(forced): 100})
    assert chat.choices[0].message.content == " banana" * 3
    args = {"model": MODEL, "prompt": "1, 1, 1, 1, 1, 1,", "max_tokens": 6, "temperature": 0}
    plain = openai_client.completions.create(**args)
    penalised = openai_client.completions.create(frequency_penalty=2.0, presence_penalty=2.0, **args)
    assert plain.choices[0].text != penalised.choices[0].text
