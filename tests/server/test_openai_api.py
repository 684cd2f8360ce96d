"""The OpenAI-compatible routes, driven by the official `openai` client, unchanged."""
from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.service

MODEL = "smollm2-135m-instruct"


def solo(kev_http: httpx.Client, question: dict, max_tokens: int) -> dict:
    return kev_http.post("/v1/query", json={"queries": [question], "max_tokens": max_tokens}).json()["results"][0]


def test_models_lists_the_served_model(openai_client: openai.OpenAI) -> None:
    assert [m.id for m in openai_client.models.list()] == [MODEL]


def test_chat_completion_equals_the_kev_answer(openai_client: openai.OpenAI, kev_http: httpx.Client) -> None:
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}]
    completion = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    expected = solo(kev_http, {"messages": messages}, 8)
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == expected["text"]
    assert completion.choices[0].finish_reason == ("stop" if expected["finish_reason"] == "stop" else "length")
    assert completion.usage.prompt_tokens == expected["prompt_tokens"]
    assert completion.usage.completion_tokens == expected["completion_tokens"]
    assert completion.usage.total_tokens == expected["prompt_tokens"] + expected["completion_tokens"]
    assert completion.system_fingerprint == expected["numerics_fingerprint"]


def test_chat_stream_reassembles_to_the_non_stream_answer(openai_client: openai.OpenAI) -> None:
    args = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 10,
            "temperature": 0, "n": 2}
    plain = openai_client.chat.completions.create(**args)
    text, reasons, usage = {0: "", 1: ""}, {}, None
    for chunk in openai_client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert [text[c.index] for c in plain.choices] == [c.message.content for c in plain.choices]
    assert reasons == {c.index: c.finish_reason for c in plain.choices}
    assert usage is not None and usage.model_dump() == plain.usage.model_dump()


def test_n_greedy_choices_agree_and_count_the_prompt_once(openai_client: openai.OpenAI) -> None:
    completion = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                       max_tokens=6, temperature=0, n=3)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert len({c.message.content for c in completion.choices}) == 1, "greedy choices are identical"
    one = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, temperature=0)
    assert completion.usage.prompt_tokens == one.usage.prompt_tokens
    assert completion.usage.completion_tokens == 3 * one.usage.completion_tokens


def test_seeded_sampling_is_reproducible(openai_client: openai.OpenAI) -> None:
    args = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a word."}], "max_tokens": 8,
            "temperature": 1.0, "top_p": 0.9, "seed": 7, "n": 2}
    first, second = openai_client.chat.completions.create(**args), openai_client.chat.completions.create(**args)
    assert [c.message.content for c in first.choices] == [c.message.content for c in second.choices]


def test_stop_string_ends_the_answer(openai_client: openai.OpenAI) -> None:
    full = openai_client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert "7" in full.choices[0].text
    cut = openai_client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=["7"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full.choices[0].text[:full.choices[0].text.index("7")]


def test_completions_list_of_prompts_runs_one_channel_each(openai_client: openai.OpenAI,
                                                           kev_http: httpx.Client) -> None:
    prompts = ["The capital of France is", "Water boils at", "1, 2, 3,"]
    completion = openai_client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    assert completion.object == "text_completion"
    assert [c.index for c in completion.choices] == [0, 1, 2]
    for prompt, choice in zip(prompts, completion.choices):
        assert choice.text == solo(kev_http, {"prompt": prompt}, 6)["text"], "each prompt answers as if alone"
    streamed = {0: "", 1: "", 2: ""}
    chunks = openai_client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, stream=True)
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert [streamed[i] for i in range(3)] == [c.text for c in completion.choices]


def test_errors_are_openai_errors(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4)
    assert not_found.value.body["param"] == "model"
    with pytest.raises(openai.UnprocessableEntityError) as invalid:
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "Hi"}], max_tokens=4)
    assert invalid.value.body["field"] == "messages[0].role"
    with pytest.raises(openai.AuthenticationError):
        openai_client.with_options(api_key="wrong").models.list()


def test_a_timed_out_answer_says_timeout_not_length(openai_client: openai.OpenAI) -> None:
    """Issue 13: a deadline that fires keeps the partial text and says so (non-standard "timeout")."""
    messages = [{"role": "user", "content": "Write a long story about the sea."}]
    completion = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=200, temperature=0,
                                                       extra_body={"timeout_ms": 1})
    assert completion.choices[0].finish_reason == "timeout"
    assert 0 < completion.usage.completion_tokens < 200
    chunks = list(openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=200, temperature=0,
                                                        stream=True, extra_body={"timeout_ms": 1}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["timeout"]
    assert "\ufffd" not in completion.choices[0].message.content
