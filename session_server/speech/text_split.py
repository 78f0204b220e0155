"""Cutting streamed text into units to synthesise (`split_granularity` of the speech WebSocket).

`none` keeps everything until the client's `input.done` and speaks it as one request (stable
timbre over long text). `sentence` cuts after `.!?` and the script marks `。！？…`, the Indic
dandas `।॥` and the Arabic question mark `؟`. `clause` also cuts after `,;`, `，；`, the Arabic
comma `،` and semicolon `؛`.

Rules, so that text arriving a few characters at a time is cut the same way as text arriving
whole:

- ASCII punctuation ends a unit only when whitespace follows it (or the client flushes), so a
  decimal (`3.14`), a thousands separator (`1,000`), a version (`v1.2`) or a URL never cut.
- A `.` after a known abbreviation (`Dr.`, `e.g.`, `etc.` is NOT one: it usually ends the
  sentence), after a single initial (`J. R. Tolkien`) or after dotted initials (`U.S.`) does not
  cut.
- A punctuation run (`Wait...`, `Really?!`) and the closing quotes or brackets after it
  (`He said "Hello."`) stay with the unit they close.
- Script marks (CJK, Indic, Arabic) are almost never abbreviations, so they cut at once, without
  waiting for whitespace.
- A unit must contain something to say (a letter or digit); punctuation alone joins the next one.
"""

from __future__ import annotations

import re

GRANULARITIES = ("none", "sentence", "clause")

_ASCII_SENTENCE = frozenset(".!?")
_ASCII_CLAUSE = frozenset(",;")
_SCRIPT_SENTENCE = frozenset("。！？…।॥؟")
_SCRIPT_CLAUSE = frozenset("，；،؛")
# Characters that may continue a punctuation run once it has started ("?!", "...", "。」").
_RUN = _ASCII_SENTENCE | _SCRIPT_SENTENCE | frozenset("‼⁇⁈⁉")
_CLOSERS = frozenset("\"'”’»)]}」』）】〉》〕")

# Lower-case, without the final dot. Titles and Latin abbreviations that are followed by more of
# the same sentence far more often than they end one.
_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "gen", "col", "lt", "sgt",
        "capt", "rev", "hon", "gov", "sen", "rep", "pres",
        "e.g", "i.e", "vs", "cf", "approx", "ca", "no", "nos", "vol", "fig", "figs", "p", "pp",
        "ch", "sec", "art", "inc", "ltd", "co", "corp", "dept", "univ", "est", "jan", "feb",
        "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    }
)
_DOTTED_INITIALS = re.compile(r"^(?:[^\W\d_]\.)+[^\W\d_]$")  # "u.s", "j.r.r" (final dot excluded)


def _word_before(text: str, end: int) -> str:
    """The token that ends at `end` (exclusive), without opening quotes or brackets."""
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    return text[start:end].lstrip("\"'“‘«([{")


def _dot_is_abbreviation(text: str, dot: int) -> bool:
    word = _word_before(text, dot)
    if not word:
        return False
    lowered = word.lower()
    if lowered in _ABBREVIATIONS:
        return True
    # An initial ("J. R. Tolkien"); not the pronoun "I", which often ends a sentence.
    if len(word) == 1 and word.isalpha() and word.isupper() and word != "I":
        return True
    return bool(_DOTTED_INITIALS.match(lowered))


class TextSplitter:
    """Stateful splitter for one utterance of the speech WebSocket.

    `feed(text)` returns the units completed by that text (possibly none); `flush()` returns the
    rest (what `input.done` should speak). With granularity `none`, `feed` never returns units.
    """

    def __init__(self, granularity: str = "none"):
        if granularity not in GRANULARITIES:
            raise ValueError(f"split_granularity must be one of {', '.join(GRANULARITIES)}; got {granularity!r}")
        self.granularity = granularity
        self._buffer = ""
        ascii_marks = _ASCII_SENTENCE | (_ASCII_CLAUSE if granularity == "clause" else frozenset())
        script_marks = _SCRIPT_SENTENCE | (_SCRIPT_CLAUSE if granularity == "clause" else frozenset())
        self._ascii_marks = ascii_marks
        self._marks = ascii_marks | script_marks

    @property
    def buffered(self) -> str:
        return self._buffer

    def has_text(self) -> bool:
        return bool(self._buffer.strip())

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        if self.granularity == "none":
            return []
        units, self._buffer = self._cut(self._buffer, flush=False)
        return units

    def flush(self) -> list[str]:
        if self.granularity == "none":
            units = [self._buffer.strip()] if self._buffer.strip() else []
        else:
            units, _ = self._cut(self._buffer, flush=True)
        self._buffer = ""
        return units

    def _cut(self, text: str, *, flush: bool) -> tuple[list[str], str]:
        units: list[str] = []
        unit_start = 0
        i = 0
        n = len(text)
        while i < n:
            mark = text[i]
            if mark not in self._marks:
                i += 1
                continue
            end = i + 1
            while end < n and text[end] in _RUN:
                end += 1
            run_length = end - i
            while end < n and text[end] in _CLOSERS:
                end += 1
            if mark in self._ascii_marks:
                if end == n and not flush:
                    break  # whitespace may still come, or more of a number: wait
                if end < n and not text[end].isspace():
                    i = end
                    continue
                if mark == "." and run_length == 1 and _dot_is_abbreviation(text, i):
                    i = end
                    continue
            piece = text[unit_start:end].strip()
            if any(ch.isalnum() for ch in piece):
                units.append(piece)
                unit_start = end
            i = end
        rest = text[unit_start:]
        if flush:
            if rest.strip():
                units.append(rest.strip())
            rest = ""
        return units, rest
