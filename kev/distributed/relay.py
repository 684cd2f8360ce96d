"""Cutting replays out of a stream of deltas.

A question redelivered after its worker died streams again from its first token, and an
aggregator that restarted relays again from what it sees. Each delta says where it starts
(text_offset, token_offset); whoever relays keeps how far it got and passes on only what
extends it. Answers are deterministic (greedy, or seeded at the router), so a replay repeats
what was sent and cutting it loses nothing. A delta that starts past the end (a gap: a lost
core message) is dropped; the final answer fills the stream up (OpenRequest.add_result).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StreamPosition:
    chars: int = 0
    tokens: int = 0

    def extend(self, text_offset: int, text: str, token_offset: int,
               token_ids: list[int]) -> tuple[str, list[int]] | None:
        """The new part of a delta, moving the position past it; None if it adds nothing or leaves a gap."""
        if text_offset > self.chars or token_offset > self.tokens:
            return None
        new_text = text[self.chars - text_offset:]
        new_ids = token_ids[self.tokens - token_offset:]
        if not new_text and not new_ids:
            return None
        self.chars += len(new_text)
        self.tokens += len(new_ids)
        return new_text, new_ids
