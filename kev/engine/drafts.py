"""Prompt-lookup drafts: a question's likely next tokens, copied from its own prompt and answer.

An extracted answer mostly copies spans of its document: after the answer's last few tokens, the tokens that
followed the same few tokens earlier in the question's own text are a good guess of what comes next. The
scheduler proposes them as extra rows of the question's channel (positions p+1..p+K, each computed exactly as
plain decoding would compute it there) and keeps the longest prefix the model itself samples, so a draft can
save steps but never change a token or a logit. Drafts read only the question's own ids, never another channel's.

`speculative` (config section, a request's field, vLLM's speculative_config) is parsed here, the one place its
names and bounds live; it is plain data, so it travels in SamplingParams like structured_outputs does.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kev.errors import QuestionError

METHODS = {"off": "off", "prompt_lookup": "prompt_lookup", "ngram": "prompt_lookup"}  # vLLM calls it ngram
# Kev's names and vLLM's speculative_config names of the same settings.
FIELDS = {"max_draft": "max_draft", "num_speculative_tokens": "max_draft", "min_match": "min_match",
          "prompt_lookup_min": "min_match", "max_match": "max_match", "prompt_lookup_max": "max_match"}
LIMITS = {"max_draft": 64, "min_match": 32, "max_match": 32}


@dataclass(frozen=True)
class DraftSettings:
    max_draft: int
    min_match: int
    max_match: int


def parse_speculative(value: Any, where: str) -> dict[str, Any] | None:
    """A request's speculative settings in Kev's names ({"method": "off"} turns the config's drafts off for it), or
    None (the config's). Fields it leaves out take the config's values when the question runs."""
    if value is None:
        return None
    if value is False:
        return {"method": "off"}
    if not isinstance(value, Mapping):
        raise QuestionError(f"{where}: must be an object {{method, max_draft, min_match, max_match}} or null")
    unknown = sorted(set(value) - set(FIELDS) - {"method"})
    if unknown:
        raise QuestionError(f"{where}: unknown field(s) {unknown} (known: method, {', '.join(FIELDS)})")
    method = value.get("method", "prompt_lookup")
    if method not in METHODS:
        raise QuestionError(f"{where}.method: must be one of {sorted(METHODS)}, got {method!r}")
    parsed: dict[str, Any] = {"method": METHODS[method]}
    for key, number in value.items():
        if key == "method" or number is None:
            continue
        name = FIELDS[key]
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= LIMITS[name]:
            raise QuestionError(f"{where}.{key}: must be an integer in [1, {LIMITS[name]}], got {number!r}")
        if name in parsed:
            raise QuestionError(f"{where}.{key}: {name} is already set (Kev's name or vLLM's, not both)")
        parsed[name] = number
    # A max_match below min_match looks up min_match tokens only (resolve raises it), as a config's could not.
    return parsed


def resolve(request: Mapping[str, Any] | None, default: Any) -> DraftSettings | None:
    """The settings a question drafts with (None: it does not): its request's over the config section's."""
    method = (request or {}).get("method", default.method)
    if method == "off":
        return None
    values = {name: (request or {}).get(name, getattr(default, name)) for name in LIMITS}
    values["max_match"] = max(values["max_match"], values["min_match"])  # a request raising only min_match
    return DraftSettings(**values)


class PromptLookup:
    """The n-grams of one question's ids (prompt, then answer), each mapped to where it last ended, grown as the
    answer grows: a lookup costs a few dict reads, not a scan of a long document."""

    def __init__(self, settings: DraftSettings) -> None:
        self.settings = settings
        # How many tokens the next draft may have: halved to what was kept after a rejection, doubled after a draft
        # kept whole, so a question that has stopped copying wastes one row a step, not max_draft
        # (bench/results/speculative.md measures both).
        self.length = min(4, settings.max_draft)
        self._seen = 0  # ids indexed so far
        # (n-gram) -> the index just past its latest occurrence that has a token after it
        self._ends: dict[tuple[int, ...], int] = {}

    def propose(self, ids: list[int], limit: int) -> list[int]:
        """Up to min(limit, max_draft) tokens that followed the latest earlier occurrence of the longest suffix of
        ids (max_match down to min_match tokens) seen before; [] when none matches."""
        settings, count = self.settings, min(limit, self.length)
        if count <= 0:
            return []
        self._index(ids)
        for n in range(min(settings.max_match, len(ids) - 1), settings.min_match - 1, -1):
            end = self._ends.get(tuple(ids[len(ids) - n:]))
            if end is not None:
                return ids[end: end + count]
        return []

    def feedback(self, drafted: int, accepted: int) -> None:
        """What the last verify step kept of a draft of `drafted` tokens: sets the next draft's length."""
        if accepted == drafted:
            self.length = min(self.settings.max_draft, max(self.length, 2 * drafted))
        else:
            self.length = max(1, accepted + 1)

    def _index(self, ids: list[int]) -> None:
        """Index every n-gram that ends before the last id (its occurrence must have a continuation)."""
        lo, hi = self.settings.min_match, self.settings.max_match
        for end in range(max(self._seen, lo), len(ids)):  # an n-gram ids[end - n: end], continued by ids[end]
            for n in range(lo, min(hi, end) + 1):
                self._ends[tuple(ids[end - n: end])] = end
        self._seen = max(self._seen, len(ids))
