"""The output processor on its own: token ids and a tokenizer in, text, events and Results out (no model)."""
from __future__ import annotations

import pytest
import torch

from kev.engine.logprobs import LogitRows
from kev.engine.output import OutputProcessor, OutputSettings, stop_prefix_length
from kev.engine.question import Phase, Question
from kev.engine.sampling_params import SamplingParams
from kev.engine.request import Request, StreamEvent
from kev.engine.plan import QuestionOutput
from kev.engine.kv.audit import AuditLog
from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer

EOS = 2
VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(resolve_model_path("smollm2-135m-instruct"))


class Harness:
    """An output processor, a request of `n` questions, and a scheduler stand-in that ends questions."""

    def __init__(self, tokenizer: Tokenizer, n: int = 1) -> None:
        self.request = Request("r", n, "strict")
        self.audit = AuditLog(None, "summary")
        self.stopped: list[Question] = []
        settings = OutputSettings(frozenset({EOS}), 2048, "fp", "round_robin")
        self.output = OutputProcessor(tokenizer, settings, {"r": self.request}, self.audit, self.stop)
        self.events: list[StreamEvent] = []
        self.output.listeners.append(self.events.append)

    def stop(self, q: Question, num_tokens: int | None = None) -> None:
        self.stopped.append(q)
        end(q, "stop")

    def feed(self, q: Question, token: int, finish: str | None = None, row: torch.Tensor | None = None) -> None:
        q.output_ids.append(token)
        if finish is not None:
            end(q, finish)
        logits = torch.zeros(1, VOCAB) if row is None else row[None]
        self.output.process([QuestionOutput(q, [token], finish, 0)], LogitRows(logits, []))  # type: ignore[arg-type]


def end(q: Question, reason: str) -> None:
    q.phase, q.finish_reason = Phase.FINISHED, reason  # type: ignore[assignment]  # what the scheduler's finish does


def question(index: int = 0, max_tokens: int = 64, stop: tuple[str, ...] = ()) -> Question:
    return Question("r", index, [1], SamplingParams(max_tokens, stop=stop), None, channel_id=index)


def test_deltas_add_up_to_the_text_and_a_stop_string_ends_the_question(tokenizer):
    h, q = Harness(tokenizer), question(stop=("blue",))
    for token in tokenizer.encode("The sea is blue today"):
        if not q.is_finished:
            h.feed(q, token)
    (result,) = h.request.results.values()
    assert h.stopped == [q] and result.finish_reason == "stop" and result.text == "The sea is "
    assert "".join(e.text for e in h.events) == result.text and h.events[-1].result is result
    assert all(e.request_id == "r" for e in h.events) and h.request.done.is_set()
    assert [e.text for e in h.request.events.queue] == [e.text for e in h.events]  # one stream, two readers


def test_eos_is_not_text_and_a_cut_answer_ends_at_a_character_boundary(tokenizer):
    h, done, cut = Harness(tokenizer, 2), question(0), question(1)
    for token in tokenizer.encode("Hi"):
        h.feed(done, token)
    h.feed(done, EOS, "stop")
    ids = tokenizer.encode("Waves 🌊")
    assert tokenizer.decode(ids[:-1]).endswith("\ufffd")  # the emoji spans the last two tokens
    for token in ids[:-1]:
        h.feed(cut, token)
    end(cut, "timeout")
    h.output.process([QuestionOutput(cut, [], "timeout")])
    assert h.request.results[0].text == "Hi" and h.request.results[0].token_ids[-1] == EOS
    assert h.request.results[1].text == "Waves " and h.request.results[1].status == "timeout"


def test_a_max_tokens_cut_inside_a_character_holds_its_bytes_back_from_text_and_deltas(tokenizer):
    h, q = Harness(tokenizer), question()
    ids = tokenizer.encode("Waves 🌊")
    for token in ids[:-2]:
        h.feed(q, token)
    h.feed(q, ids[-2], "length")  # max_tokens reached in the middle of the emoji's bytes
    (result,) = h.request.results.values()
    assert result.text == "Waves " and result.token_ids == ids[:-1] and result.finish_reason == "length"
    assert "".join(e.text for e in h.events) == "Waves "


@pytest.mark.parametrize("include, text", [(False, "The sea is "), (True, "The sea is blue")])
def test_include_stop_str_in_output_keeps_the_stop_string(tokenizer, include, text):
    h = Harness(tokenizer)
    q = Question("r", 0, [1], SamplingParams(64, stop=("blue",), include_stop_str_in_output=include), None,
                 channel_id=0)
    for token in tokenizer.encode("The sea is blue today"):
        if not q.is_finished:
            h.feed(q, token)
    (result,) = h.request.results.values()
    assert result.finish_reason == "stop" and result.text == text and "".join(e.text for e in h.events) == text


def test_an_answer_reaching_max_context_is_audited(tokenizer):
    h, q = Harness(tokenizer), question()
    h.feed(q, tokenizer.encode("Hi")[0], "length")  # "length" before max_tokens: the channel's context is full
    assert h.audit.alert_counts == {"truncation_near_boundary": 1}
    h2, q2 = Harness(tokenizer), question(max_tokens=1)
    h2.feed(q2, tokenizer.encode("Hi")[0], "length")
    assert h2.audit.alert_counts == {}  # max_tokens reached: no alert


@pytest.mark.parametrize("same", [True, False])
def test_a_shadow_rerun_verifies_the_answer_it_copies(tokenizer, same):
    h, original = Harness(tokenizer), question(max_tokens=1)
    original.shadow = True
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    h.feed(original, 5, "length", row)
    assert h.request.results == {}  # held until its re-run is compared
    shadow = original.shadow_copy()
    h.feed(shadow, 5, "length", row if same else row + 1)
    (result,) = h.request.results.values()
    assert result.isolation_verified is same
    assert h.audit.alert_counts == ({} if same else {"shadow_mismatch": 1})


def test_stop_prefix_length():
    assert stop_prefix_length("The sea is", ("is blue",)) == 2
    assert stop_prefix_length("The sea is", ("zzz" * 100,)) == 0
    assert stop_prefix_length("abab", ("abac",)) == 2
