"""router.categories: coarse keyword/regex classes applied before hashing; each owns a channel group."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

OTHER = "other"


class CategoryMatcher:
    def __init__(self, categories: Mapping[str, Sequence[str]]) -> None:
        # Declared order is match order: the first category with a matching pattern wins.
        self._rules = [(name, re.compile("|".join(f"(?:{p})" for p in patterns), re.I))
                       for name, patterns in categories.items()]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._rules] + ([OTHER] if self._rules else [])

    def match(self, text: str) -> str:
        return next((name for name, rule in self._rules if rule.search(text)), OTHER)
