"""The one engine call: a chat or completion body becomes the same questions wherever it is sent (route, Responses,
batch line), and a surface that cannot take something refuses it by name. No model needed."""
from __future__ import annotations

import pytest

import kev
from kev.model.tokenizer import Tokenizer
from kev.wire.bodies.errors import ApiError
from kev.wire.bodies.openai_models import ChatCompletionBody, CompletionBody
from kev.wire.engine_call import Served, ToolSetup, chat_call, completion_call, served_model_name
from kev.wire.limits import Limits

CONFIG = kev.load_config({"router": {"default_max_tokens": 7}})
MODEL = served_model_name(CONFIG)
LIMITS = Limits.from_config(CONFIG)


def _no_tokenizer() -> Tokenizer:
    raise AssertionError("a body without tools never asks for the tokenizer")


LIVE = Served(MODEL, LIMITS, ToolSetup(_no_tokenizer, "hermes", None))
LINE = Served(MODEL, LIMITS, batch_line=True)


def chat(**body: object) -> ChatCompletionBody:
    return ChatCompletionBody.model_validate({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **body})


def test_a_route_and_a_batch_line_make_the_same_call() -> None:
    body = chat(n=2, best_of=3, seed=5, temperature=0.5, logprobs=True, top_logprobs=1, isolation="strict")
    live, line = chat_call(body, LIVE), chat_call(body, LINE)
    assert live == line
    assert [q["seed"] for q in live.queries] == [5, 6, 7] and (live.shape.n, live.keep) == (3, 2)
    assert live.sampling.max_tokens == 7  # router.default_max_tokens, the server's default where the body has none
    assert live.options == {"isolation": "strict"} and live.logprobs
    prompt = CompletionBody.model_validate({"model": MODEL, "prompt": [[5], [1, 2]], "echo": True, "max_tokens": 1})
    text = completion_call(prompt, LINE)
    assert text == completion_call(prompt, LIVE) and text.echo == ([5], [1, 2])
    reply = text.reply(MODEL, lambda ids: "+".join(map(str, ids)), "abc")
    assert reply.id == "cmpl-abc" and reply.echo == ("5", "1+2")


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"model": "other"}, 404, "model: 'other' is not served here"),
    ({"stream": True}, 400, "stream: a batch line cannot stream"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 422, "tools: tool calling is not supported in a "
                                                                         "batch line"),
])
def test_a_batch_line_refuses_what_it_cannot_answer_by_name(body: dict[str, object], status: int,
                                                            message: str) -> None:
    with pytest.raises(ApiError) as refused:
        chat_call(chat(**body), LINE)
    assert refused.value.status_code == status and refused.value.message.startswith(message)


def test_the_route_names_an_unknown_model_as_a_batch_line_does() -> None:
    refusals = []
    for served in (LIVE, LINE):
        with pytest.raises(ApiError) as refused:
            chat_call(chat(model="other"), served)
        refusals.append(refused.value.body())
    assert refusals[0] == refusals[1] and refusals[0]["error"]["param"] == "model"
