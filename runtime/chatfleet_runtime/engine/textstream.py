"""Streamed text of one row: token ids to text deltas, and stop sequences found across deltas.

Plain Python over a tokenizer's ``decode``: no torch, testable on strings.
"""

from __future__ import annotations

from collections.abc import Sequence


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas without splitting multi-byte characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_id: int) -> str:
        """Append a token and return the newly complete text (may be empty)."""
        return self.extend([token_id])

    def extend(self, token_ids: Sequence[int]) -> str:
        """Append tokens and return the newly complete text (may be empty)."""
        self.ids.extend(token_ids)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        new = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return new[len(prefix) :]
        return ""

    def flush(self) -> str:
        """The text still held back at the end of generation, an incomplete last character included.

        extend() holds text ending in U+FFFD (a character whose bytes are not all there yet); when no more
        tokens come, that text is the answer's end and must not be lost.
        """
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        new = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        self.prefix_offset = self.read_offset = len(self.ids)
        return new[len(prefix) :] if len(new) > len(prefix) else ""


class StopMatcher:
    """Finds stop sequences in streamed text and holds back text that could still begin one.

    >>> m = StopMatcher(("END",))
    >>> m.feed("hello E"), m.feed("N"), m.feed("D and more")
    ('hello ', '', '')
    >>> m.stopped, m.text
    (True, 'hello ')
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add a delta; return the text now safe to emit."""
        if self.stopped:
            return ""
        self.text += delta
        if not self.stops:
            out, self.emitted = self.text[self.emitted :], len(self.text)
            return out
        start = max(0, self.emitted - max(len(s) for s in self.stops))
        cut = min((i for i in (self.text.find(s, start) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.stopped = True
            out, self.emitted = self.text[self.emitted :], len(self.text)
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        safe = len(self.text) - hold
        out = self.text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return out

    def flush(self) -> str:
        """Emit whatever is held back (at the end of generation)."""
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out
