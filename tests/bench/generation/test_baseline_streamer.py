"""The baselines' streamer: each row's text as it grows, its end at EOS or its
max_tokens, with a stand-in tokenizer (no model)."""

from __future__ import annotations

import asyncio

import numpy as np

from bench.generation.local import Pending, Rows

EOS = 0


class Tokenizer:
    """Token t decodes to chr(96 + t); 9 is half a character until 10 follows."""

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        text = ""
        for i, t in enumerate(ids):
            if t == 9:
                text += "é" if i + 1 < len(ids) and ids[i + 1] == 10 else "\ufffd"
            elif t != 10 or i == 0 or ids[i - 1] != 9:
                text += chr(96 + t)
        return text


async def test_rows_end_at_eos_or_their_own_limit() -> None:
    loop = asyncio.get_running_loop()
    short, long_, eos = (Pending([1, 2], n, 3, loop) for n in (2, 5, 5))
    rows = Rows([short, long_, eos], Tokenizer(), EOS)
    rows.put(np.array([[1, 2], [1, 2], [1, 2]]))  # the prompts: not tokens
    steps = [[1, 1, 3], [2, 9, EOS], [EOS, 10, EOS], [EOS, 4, EOS]]
    for step in steps:
        rows.put(np.array(step))
    assert rows.done == [True, False, True]
    rows.finish_all("length")
    await asyncio.sleep(0)  # the events are scheduled on the loop

    def drain(pending: Pending) -> list[tuple[object, ...]]:
        events = []
        while not pending.events.empty():
            events.append(pending.events.get_nowait())
        return events

    # max_tokens 2: ended after its second token, the rest ignored
    assert drain(short) == [("text", "a"), ("text", "b"), ("end", "length", 2, 2)]
    # half a character is held back until it is whole
    assert drain(long_) == [("text", "a"), ("text", "é"), ("text", "d"), ("end", "length", 2, 4)]
    # EOS ends a row and is not counted as output
    assert drain(eos) == [("text", "c"), ("end", "stop", 2, 1)]
