"""Logprobs, per channel: of the model's own distribution, before temperature, top-k/top-p and any grammar mask.

Which logits rows a step computes for a question: its sampling row, and with prompt_logprobs every
row of its prompt chunks (row p predicts token p + 1). The packer asks `logit_rows`, the engine
splits the logits with `LogitRows`; both walk the work in the same order, so they agree.
Every number comes from one question's own row, so it is the same bits in a batch as alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kev.engine.plan import Work
from kev.model.tokenizer import Tokenizer


def logit_rows(w: Work, first_row: int) -> list[int]:
    """The packed rows of w whose logits the model returns, in order; the sampling row is last."""
    if w.scores_prompt or w.draft:  # a drafted decode samples every one of its rows
        return list(range(first_row, first_row + w.length))
    return [first_row + w.length - 1] if w.samples else []


@dataclass
class LogitRows:
    """The step's logits cut per work item: the sampling rows and each scored prompt chunk."""

    sampling: torch.Tensor  # [num_sampling, vocab]: per work item that samples, in order, 1 + len(draft) rows
    chunks: list[tuple[Work, torch.Tensor]]  # (work, [length, vocab]) for chunks that score their prompt

    @classmethod
    def split(cls, work: list[Work], logits: torch.Tensor) -> LogitRows:
        picks: list[int] = []
        chunks: list[tuple[Work, torch.Tensor]] = []
        row = 0
        for w in work:
            count = len(logit_rows(w, 0))
            if w.scores_prompt:
                chunks.append((w, logits[row: row + count]))
            if w.samples:
                picks.extend(range(row + count - 1 - len(w.draft), row + count))
            row += count
        return cls(logits[picks] if len(picks) != row else logits, chunks)


class TokenTexts:
    """A token's text and raw bytes, as OpenAI's logprobs show them (bytes keep split UTF-8 characters)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
        self._texts: dict[int, str] = {}  # per token id; the vocabulary bounds them
        self._bytes: dict[int, tuple[int, ...]] = {}

    def text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self._texts[token_id]

    def bytes(self, token_id: int) -> tuple[int, ...]:
        if token_id not in self._bytes:
            piece = self.tokenizer.id_to_token(token_id)
            is_bytes = piece is not None and all(ch in self._byte_of for ch in piece)
            if piece is not None and is_bytes and not self.tokenizer.is_special(token_id):
                self._bytes[token_id] = tuple(self._byte_of[ch] for ch in piece)  # byte-level BPE: a character a byte
            else:
                self._bytes[token_id] = tuple(self.text(token_id).encode("utf-8"))
        return self._bytes[token_id]


def token_logprob(logprobs: torch.Tensor, token_id: int, top: int, texts: TokenTexts) -> dict[str, Any]:
    """logprobs: [vocab] log-softmax of one row. The chosen token and its `top` most likely alternatives."""
    entry = _entry(token_id, float(logprobs[token_id]), texts)
    if top > 0:
        values, ids = torch.topk(logprobs, top)
        entry["top_logprobs"] = [_entry(int(i), float(v), texts) for v, i in zip(values.tolist(), ids.tolist())]
    else:
        entry["top_logprobs"] = []
    return entry


def sampled_entry(row: torch.Tensor, token_id: int, top: int, texts: TokenTexts) -> dict[str, Any]:
    """The new token's logprob, from its own logits row (raw: before temperature, top-p and grammar)."""
    return token_logprob(torch.log_softmax(row.float(), dim=-1), token_id, top, texts)


def prompt_entries(prompt: list[int], start: int, logits: torch.Tensor, top: int,
                   texts: TokenTexts) -> list[dict[str, Any]]:
    """Prompt logprobs of one chunk at `start`: row p scores prompt token p + 1; the prompt's first token has logprob
    None (its entry comes with the first chunk)."""
    entries = [{**_entry(prompt[0], None, texts), "top_logprobs": []}] if start == 0 else []
    for offset in range(logits.shape[0]):
        position = start + offset + 1
        if position < len(prompt):
            row = torch.log_softmax(logits[offset].float(), dim=-1)
            entries.append(token_logprob(row, prompt[position], top, texts))
    return entries


def _entry(token_id: int, logprob: float | None, texts: TokenTexts) -> dict[str, Any]:
    return {"token_id": token_id, "token": texts.text(token_id), "bytes": list(texts.bytes(token_id)),
            "logprob": logprob}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character (what byte-level BPE vocabularies store)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))
