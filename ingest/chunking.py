"""Documents longer than their model's window become passages, each a point of its own.

**Counting** is the model's: a ``TokenWindow`` counts a text as the worker will see it,
the document prompt (e5's ``passage: ``) and the special tokens included, so a passage
that fits here is never refused there.

**Boundaries** come from semantic-text-splitter (the Rust ``text-splitter``): a passage
is the largest run of whole units that fits, trying paragraphs (blank lines), then
lines, then Unicode sentences (UAX #29), and only for a sentence longer than a passage
words and then characters, so such a sentence is cut into passages filled to the token
limit. Up to ``overlap_tokens`` of the previous passage's last units start the next.
The splitter never fills a passage with part of a unit above the one it splits by, so
a heading before a long paragraph would be a passage alone; neighbours that fit
together are joined afterwards (every passage still ends where the splitter cut).
Measured on 2,000 BGB sections with all-MiniLM-L6-v2's tokenizer (256 tokens): 0.9 s
on one core, no passage over the window, every span exact; German and English prose
end their passages at sentence or paragraph ends.

**Hard-wrapped text** (a text that separates paragraphs by blank lines, as Markdown and
plain-text files do) has line breaks inside sentences; the splitter would prefer them
to sentence ends. There a lone line break counts as a space: the substitution is one
character for one, so every offset still points into the original text.

**Spans**: passage ``i`` is ``text[start:end]`` of the original, trimmed of whitespace;
passages are in document order. A text that fits the limit is one passage, the whole
text untouched, so short documents are stored exactly as before chunking existed.

**Pages** (a document read by OCR, ``page_passages``): each page is split alone, so a
passage never spans pages; passages are numbered through the document, page by page,
and each knows its page, the page's lines it holds (``line_start:line_end`` of the
page's OCR lines, in reading order) and their box; ``start:end`` index the page's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from semantic_text_splitter import TextSplitter

from ingest.reading import ReadPage

_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")
# A line break with a non-blank line on both sides (and the spaces or \r before it).
_WRAP = re.compile(r"(?<=\S)[ \t\r]*\n(?=[ \t]*\S)")


@dataclass(frozen=True, slots=True)
class TokenWindow:
    """How a model takes one document: at most ``max_tokens`` tokens, as ``count`` counts
    a text (its prompt and special tokens included, so ``count("")`` is their cost)."""

    max_tokens: int
    count: Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Passage:
    index: int
    start: int  # character offsets into the document's text: text[start:end]
    end: int
    text: str
    # A page of a document read by OCR: its index, the lines [line_start, line_end) of it
    # that the passage holds, and their box in the page's pixels (x0, y0, x1, y1).
    page: int | None = None
    line_start: int | None = None
    line_end: int | None = None
    bbox: tuple[float, float, float, float] | None = None


def unwrapped(text: str) -> str:
    """``text`` with its wrapping line breaks as spaces, if it has blank-line paragraphs;
    the same length, so offsets carry over."""
    if not _BLANK_LINE.search(text):
        return text
    return _WRAP.sub(lambda m: " " * len(m.group()), text)


class PassageSplitter:
    """Splits texts for one model. ``max_tokens`` caps a passage below the window (0: the
    window); ``overlap_tokens`` repeats the end of a passage at the start of the next,
    at most half a passage. Deterministic: the same text gives the same passages."""

    def __init__(self, window: TokenWindow, *, max_tokens: int = 0, overlap_tokens: int = 0):
        if max_tokens < 0 or overlap_tokens < 0:
            raise ValueError("max_tokens and overlap_tokens must not be negative")
        self.window = window
        self.limit = min(max_tokens or window.max_tokens, window.max_tokens)
        self.overhead = window.count("")  # the prompt's and the special tokens' share
        room = self.limit - self.overhead
        if room < 1:
            raise ValueError(
                f"passages of {self.limit} tokens leave no room for text after the model's "
                f"prompt and special tokens ({self.overhead}): raise the passage size"
            )
        self.room = room
        self.overlap = min(overlap_tokens, room // 2)
        self._splitters: dict[int, TextSplitter] = {}

    def fits(self, text: str) -> bool:
        return self.window.count(text) <= self.limit

    def split(self, text: str) -> list[Passage]:
        if self.fits(text):
            return [Passage(0, 0, len(text), text)]
        spans = self._joined(text, self._spans(text, 0, len(text), self.room))
        return [Passage(i, start, end, text[start:end]) for i, (start, end) in enumerate(spans)]

    def _joined(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Neighbouring spans joined, left to right, while the join fits the limit."""
        joined = [spans[0]]
        for start, end in spans[1:]:
            first = joined[-1][0]
            if self.window.count(text[first:end]) <= self.limit:
                joined[-1] = (first, end)
            else:
                joined.append((start, end))
        return joined

    def _spans(self, text: str, begin: int, stop: int, room: int) -> list[tuple[int, int]]:
        """Spans of ``text[begin:stop]`` with at most ``room`` text tokens each. Counting a
        passage alone can differ from counting it inside the text by a token at an edge:
        one over the limit is split again with the room made smaller by the excess."""
        part = unwrapped(text[begin:stop])
        spans: list[tuple[int, int]] = []
        for offset, piece in self._splitter(room).chunk_indices(part):
            start, end = begin + offset, begin + offset + len(piece)
            excess = self.window.count(text[start:end]) - self.limit
            if excess > 0 and room - excess >= 1 and end - start > 1:
                spans.extend(self._spans(text, start, end, room - excess))
            else:  # fits (or is one character: the worker then says it is too long)
                spans.append((start, end))
        return spans

    def _splitter(self, room: int) -> TextSplitter:
        splitter = self._splitters.get(room)
        if splitter is None:
            overhead, count = self.overhead, self.window.count
            splitter = TextSplitter.from_callback(
                lambda piece: count(piece) - overhead,
                room,
                overlap=min(self.overlap, room // 2),
                trim=True,
            )
            self._splitters[room] = splitter
        return splitter


class Chunking:
    """The passages of each document, split for the model that embeds it, and the reason
    a document over its model's window is dead-lettered when it is not split.

    ``windows`` gives a model's window (``None`` while it is not loaded: its documents
    go whole, and the worker answers for them). ``enabled=False`` keeps every document
    whole: one over the window is then refused by the worker, or cut (--auto-truncate).
    """

    def __init__(
        self,
        windows: Callable[[str], TokenWindow | None],
        *,
        enabled: bool = True,
        max_tokens: int = 0,
        overlap_tokens: int = 0,
    ) -> None:
        self.windows = windows
        self.enabled = enabled
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self._splitters: dict[str, PassageSplitter] = {}

    def splitter(self, model: str) -> PassageSplitter | None:
        if model not in self._splitters:
            window = self.windows(model)
            if window is None:
                return None  # not loaded (yet): ask again next time
            self._splitters[model] = PassageSplitter(
                window, max_tokens=self.max_tokens, overlap_tokens=self.overlap_tokens
            )
        return self._splitters[model]

    def split(self, model: str, text: str) -> list[Passage]:
        splitter = self.splitter(model) if self.enabled else None
        if splitter is None:
            return [Passage(0, 0, len(text), text)]
        return splitter.split(text)

    def too_long(self, model: str, text: str) -> str:
        """Why a document (or one of its passages) was refused as too long, naming the
        flags of `flotilla ingest` that change it."""
        window = self.windows(model)
        limit = f"the {window.max_tokens}-token window" if window else "the window"
        if self.enabled:
            return f"a passage is over {limit} of model {model!r}: lower --chunk-max-tokens"
        size = f"has {window.count(text)} tokens, over" if window else "is longer than"
        return (
            f"the document {size} {limit} of model {model!r}: ingest with --chunking "
            "(the default) to split it into passages, or with --auto-truncate to cut it"
        )


def line_spans(page: ReadPage) -> list[tuple[int, int]]:
    """Where each of the page's lines is in its text: the text is the lines in order,
    joined by separators, so each is found after the one before."""
    spans: list[tuple[int, int]] = []
    at = 0
    for line in page.lines:
        found = page.markdown.find(line.text, at)
        if found < 0:  # not in the text (never, for a /v1/ocr answer): an empty span
            spans.append((at, at))
            continue
        spans.append((found, found + len(line.text)))
        at = found + len(line.text)
    return spans


def page_passages(
    split: Callable[[str], list[Passage]], pages: Sequence[ReadPage]
) -> list[Passage]:
    """The passages of a document's pages, each page split by ``split`` on its own."""
    out: list[Passage] = []
    for page in pages:
        if not page.markdown.strip():
            continue  # a blank page has nothing to find
        spans = line_spans(page)
        for part in split(page.markdown):
            held = [i for i, (a, b) in enumerate(spans) if a < part.end and b > part.start]
            first, last = (held[0], held[-1] + 1) if held else (0, 0)
            boxes = [page.lines[i].bbox for i in held]
            bbox = (
                (
                    min(b[0] for b in boxes),
                    min(b[1] for b in boxes),
                    max(b[2] for b in boxes),
                    max(b[3] for b in boxes),
                )
                if boxes
                else None
            )
            out.append(
                replace(
                    part,
                    index=len(out),
                    page=page.index,
                    line_start=first,
                    line_end=last,
                    bbox=bbox,
                )
            )
    return out
