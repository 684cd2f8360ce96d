"""Normalization: what must change, what must stay byte for byte, and idempotence."""
from __future__ import annotations

import pytest

from kev.config.schema import DEFAULT_FILLER_WORDS, DEFAULT_GREETINGS
from kev.router.normalize import Normalizer

NORMALIZER = Normalizer(DEFAULT_FILLER_WORDS, DEFAULT_GREETINGS)

CHANGED = [
    ("嗯，怎么退款？？？", "怎么退款?"),
    ("嗯嗯嗯，那个，，怎么退款", "怎么退款"),
    ("你好，客服，打扰一下，请问一下，怎么修改地址！！！", "怎么修改地址!"),
    ("请问怎么退款", "怎么退款"),
    ("您好：请问在哪里", "在哪里"),
    ("怎么退款……", "怎么退款..."),
    ("怎么  退款\n\n\n  好的", "怎么 退款\n好的"),
    ("ＡＢＣ１２３？", "ABC123?"),  # NFKC: fullwidth letters and digits
    ("怎么\u3000退款", "怎么 退款"),  # ideographic space
    ("Well, how do I reset my password???", "how do I reset my password?"),
    ("um how do I get a refund", "how do I get a refund"),
    ("Uh, hi there! What is the capital of France?", "What is the capital of France?"),
    ("Hello!!! Really!!!!!", "Really!"),
    ("Wait.......", "Wait..."),
    ("  spaced   out\tquestion  ", "spaced out question"),
]

UNCHANGED = [
    "那个问题怎么解决",  # 那个 = "that" here: only dropped before punctuation
    "你好看吗",  # 你好 inside a word
    "Well water safety?",
    "Hello world program in C",
    "ER visit cost?",
    "So what?",
    "What does ?? do in C#?",  # two-char operators stay
    "x² + y² = z²",  # NFKC would make these plain digits
    "嗯",  # never emptied
    "hi.",
    "```\nprint(\"！！！\")   \n```",  # code blocks untouched
    "用 `a  ！！ b` 还是别的",  # inline code untouched
    "",
]


@pytest.mark.parametrize("text, expected", CHANGED)
def test_normalizes(text, expected):
    assert NORMALIZER.normalize(text) == expected


@pytest.mark.parametrize("text", UNCHANGED)
def test_keeps_meaningful_text(text):
    assert NORMALIZER.normalize(text) == text


def test_quotes_and_code_are_kept_verbatim_inside_a_normalized_question():
    text = '嗯，解释一下 "嗯，，，  好！！！" 和 「！！！」 以及 ```\n a  =  1！！\n``` 的区别？？？'
    out = NORMALIZER.normalize(text)
    assert out == '解释一下 "嗯，，，  好！！！" 和 「！！！」 以及 ```\n a  =  1！！\n``` 的区别?'


@pytest.mark.parametrize("text", [t for t, _ in CHANGED] + UNCHANGED)
def test_idempotent(text):
    once = NORMALIZER.normalize(text)
    assert NORMALIZER.normalize(once) == once


def test_switch_off_and_custom_fillers():
    switched_off = Normalizer(DEFAULT_FILLER_WORDS, DEFAULT_GREETINGS, enabled=False)
    assert switched_off.normalize("嗯，怎么退款？？？") == "嗯，怎么退款？？？"
    custom = Normalizer(("basically",), ())
    assert custom.normalize("Basically, what is X?") == "what is X?"
    assert custom.normalize("嗯，what is X?") == "嗯,what is X?"  # 嗯 is not in this list; NFKC still applies
