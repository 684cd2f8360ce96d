"""Questions of widely varying length for `kev stress`, measured in the engine's own prompt tokens.

Short, medium and long questions, and one in six ending a few tokens before max_context, so its
answer is cut by the context limit (truncation near the channel's boundary).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from kev.model.tokenizer import Tokenizer

WORDS: list[str] = (
    "attention channel block cache prefix token layer head query key value mask step batch "
    "river mountain lantern copper violet harbour meadow falcon thunder orchard glacier "
    "注意力 通道 缓存 前缀 隔离 模型 问题 答案 长度 显存 批次 路由 聚合 窗口").split()
ASKS: list[str] = ["Summarise these notes:", "What do these words have in common?", "请用一句话概括：",
                   "Sort these words:", "Translate to English:", "Which word comes first?"]


@dataclass(frozen=True)
class StressQuestion:
    text: str
    system: str | None  # system prompt it is asked with (the shared prefix), if any
    prompt_tokens: int  # as the engine will count them (chat template included)


def prompt_tokens(tokenizer: Tokenizer, text: str, system: str | None) -> int:
    """The engine's count: the chat template around [system?, user], or the bare contents."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    if tokenizer.has_chat_template:
        return len(tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=True)))
    return len(tokenizer.encode("\n".join(m["content"] for m in messages)))


def content_lengths(n: int, max_context: int, rng: random.Random) -> list[int | None]:
    """Tokens of question content beyond the template: short, medium, long; None = up to the boundary.

    One question in six (at least) is None: its prompt ends 2-8 tokens before max_context.
    """
    lengths: list[int | None] = []
    for i in range(n):
        roll = rng.random()
        if i % 6 == 5:
            lengths.append(None)
        elif roll < 0.4:
            lengths.append(rng.randint(1, 16))
        elif roll < 0.75:
            lengths.append(rng.randint(30, 100))
        else:
            lengths.append(rng.randint(150, max(151, max_context // 2)))
    return lengths


def make_question(tokenizer: Tokenizer, content: int | None, max_context: int, system: str | None,
                  rng: random.Random) -> StressQuestion:
    """The longest question of random words within its token target (binary search over the word count)."""
    ask = rng.choice(ASKS)
    base = prompt_tokens(tokenizer, ask, system)
    target = max_context - rng.randint(2, 8) if content is None else min(base + content, max_context - 2)
    words = [rng.choice(WORDS) for _ in range(max(0, target - base))]
    low, high = 0, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        if prompt_tokens(tokenizer, f"{ask} {' '.join(words[:mid])}", system) <= target:
            low = mid
        else:
            high = mid - 1
    text = f"{ask} {' '.join(words[:low])}".strip()
    return StressQuestion(text, system, prompt_tokens(tokenizer, text, system))


def make_questions(tokenizer: Tokenizer, n: int, max_context: int, rng: random.Random,
                   systems: list[str | None]) -> list[StressQuestion]:
    """n distinct questions; each asked with a system prompt drawn from `systems`."""
    questions: dict[tuple[str, str | None], StressQuestion] = {}
    for content in content_lengths(n, max_context, rng):
        for _ in range(5):  # a short random question may repeat: draw again
            q = make_question(tokenizer, content, max_context, rng.choice(systems), rng)
            if (q.text, q.system) not in questions and q.prompt_tokens < max_context:
                questions[(q.text, q.system)] = q
                break
    return list(questions.values())
