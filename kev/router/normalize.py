"""Normalizer: strip what costs tokens but carries no meaning, before a question is hashed or run.

Unicode NFKC, collapsed whitespace and repeated punctuation, no leading filler words or
greetings. Code blocks, inline code and quoted text are never touched. The rules err on
keeping text: a word that is also an ordinary word ("well water", "那个问题", "hello world")
is dropped only when punctuation follows it, so normalization never changes meaning.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

# Spans kept byte for byte: fenced code, inline code, quotations.
_PROTECTED = re.compile(
    r"```.*?(?:```|\Z)|~~~.*?(?:~~~|\Z)|`[^`\n]+`"
    r"|\"[^\"\n]*\"|“[^”]*”|‘[^’]*’|「[^」]*」|『[^』]*』|《[^》]*》",
    re.S,
)
# Fullwidth runs go first (before NFKC makes them ASCII): ！！！ → ！, …… → …
_CJK_RUN = re.compile(r"([！？。，、；：～…])\1+")
# ASCII runs are collapsed only from three on, so operators like ?? and !! stay.
_ASCII_RUN = re.compile(r"([!?])\1{2,}|(,),+|\.{4,}")
_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r"[^\S\n]*\n\s*")
_SEPARATOR = r"\s*[,.!?;:~、。…]+\s*"
# Pure interjections: also dropped before a plain space ("um how do I").
_SPACE_OK = frozenset({"嗯", "呃", "um", "umm", "uh", "uhh", "uhm", "erm", "hmm"})
# Pure politeness markers: dropped before anything ("请问怎么退款").
_BARE_OK = frozenset({"请问", "请问一下", "想问一下", "我想问一下", "麻烦问一下", "麻烦问下"})
# NFKC would turn these into plain digits (x² → x2), which changes meaning.
_KEEP_TAGS = ("<super>", "<sub>", "<fraction>")


def _alternation(words: Iterable[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))


@dataclass
class Normalizer:
    filler_words: tuple[str, ...] = ()
    greetings: tuple[str, ...] = ()
    enabled: bool = True
    _prefixes: list[re.Pattern[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        words = [w.strip() for w in (*self.filler_words, *self.greetings) if w.strip()]
        rules = [(words, _SEPARATOR), ([w for w in words if w.lower() in _SPACE_OK], r"\s+"),
                 ([w for w in words if w in _BARE_OK], r"\s*")]
        self._prefixes = [re.compile(rf"^(?:{_alternation(ws)})+{tail}", re.I) for ws, tail in rules if ws]

    def normalize(self, text: str) -> str:
        """The normalized text; the identity when disabled. Idempotent."""
        if not self.enabled:
            return text
        segments = self._segments(text)
        cleaned = [(free, _clean(seg) if free else seg) for free, seg in segments]
        if cleaned and cleaned[0][0]:
            cleaned[0] = (True, cleaned[0][1].lstrip())
        if cleaned and cleaned[-1][0]:
            cleaned[-1] = (True, cleaned[-1][1].rstrip())
        if cleaned and cleaned[0][0]:
            rest = "".join(seg for _, seg in cleaned[1:])
            cleaned[0] = (True, self._drop_prefixes(cleaned[0][1], has_more=bool(rest.strip())))
        return "".join(seg for _, seg in cleaned)

    def _drop_prefixes(self, head: str, has_more: bool) -> str:
        for _ in range(16):  # "嗯，你好，请问一下，…": peel one prefix at a time
            match = next((m for p in self._prefixes if (m := p.match(head))), None)
            if match is None or not (head[match.end():].strip() or has_more):
                return head  # never leave a question empty
            head = head[match.end():]
        return head

    @staticmethod
    def _segments(text: str) -> list[tuple[bool, str]]:
        """(is_free, text) pieces; protected pieces are never changed."""
        pieces: list[tuple[bool, str]] = []
        last = 0
        for match in _PROTECTED.finditer(text):
            pieces += [(True, text[last:match.start()]), (False, match.group())]
            last = match.end()
        pieces.append((True, text[last:]))
        return [p for p in pieces if p[1]]


def _clean(text: str) -> str:
    text = _nfkc(_CJK_RUN.sub(r"\1", text))
    text = _ASCII_RUN.sub(lambda m: m.group(1) or m.group(2) or "...", text)
    return _NEWLINES.sub("\n", _SPACES.sub(" ", text))


def _nfkc(text: str) -> str:
    """NFKC, except characters whose compatibility form would change meaning."""
    if text.isascii():
        return text
    kept = [i for i, ch in enumerate(text) if unicodedata.decomposition(ch).startswith(_KEEP_TAGS)]
    if not kept:
        return unicodedata.normalize("NFKC", text)
    out, last = [], 0
    for i in kept:
        out += [unicodedata.normalize("NFKC", text[last:i]), text[i]]
        last = i + 1
    return "".join(out) + unicodedata.normalize("NFKC", text[last:])
