"""From generated tokens to text: stop strings, and the part of it safe to stream.

The text is decoded from all the generated tokens each time (a token alone may be half
a character, and tokenizers merge spaces across tokens). A streamed delta holds back
what could still turn into a stop string or is an incomplete character, so a client
never sees text that the final answer cuts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decoder writes for an incomplete UTF-8 sequence


class TextSoFar:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self.decode = decode
        self.stops = tuple(s for s in stops if s)
        self.tokens: list[int] = []
        self.text = ""
        self.stopped = False  # a stop string appeared; ``text`` ends before it
        self.sent = 0  # characters already streamed

    def add(self, token: int) -> None:
        self.tokens.append(token)
        text = self.decode(self.tokens)
        cut = min((i for s in self.stops if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        self.text = text

    def delta(self, final: bool = False) -> str:
        """The text not streamed yet that no later token can change (all of it when
        ``final``); marks it streamed."""
        end = len(self.text) if final or self.stopped else self._settled()
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _settled(self) -> int:
        text = self.text
        end = len(text)
        while end > 0 and text[end - 1] == REPLACEMENT:
            end -= 1
        # The longest tail that starts some stop string waits for the next tokens.
        hold = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, end), hold, -1):
                if text[end - n : end] == stop[:n]:
                    hold = n
                    break
        end -= hold
        return max(end, self.sent)
