"""Tokenizing as every runtime does it: a Hugging Face fast tokenizer, inputs cut to the
model's window on the side a request asks, a prompt's tokens kept when the left side
is cut. Torch-free: the ONNX Runtime and OpenVINO runtimes tokenize exactly as the
torch one does, so the same request gives the same ids on every runtime.
"""

from __future__ import annotations

from collections.abc import Sequence

from embedder.core.jobs import TruncationSide
from embedder.tasks.embed.runtimes import Encoded


class Tokenizing:
    """The tokenizing half of a runtime. A runtime sets ``tokenizer`` (a fast tokenizer,
    called like ``transformers`` tokenizers are) and ``max_tokens``."""

    tokenizer: object
    max_tokens: int

    def _encode(
        self, first: list[str], second: list[str] | None, side: TruncationSide, prefix: str = ""
    ) -> Encoded:
        tok = self.tokenizer
        if prefix:
            first = [prefix + text for text in first]
        full = tok(  # type: ignore[operator]
            first, second, add_special_tokens=True, truncation=False, verbose=False
        )
        ids: list[list[int]] = full["input_ids"]
        types: list[list[int]] | None = full.get("token_type_ids")
        lengths = [len(x) for x in ids]
        limit = self.max_tokens
        over = [i for i, n in enumerate(lengths) if n > limit]
        if over and prefix and side == "left" and second is None:
            for i in over:  # the tokenizer would cut the prompt off with the text's start
                ids[i], cut_types = self._cut_left_after_prefix(first[i], len(prefix), limit)
                if types is not None:
                    types[i] = cut_types
        elif over:
            tok.truncation_side = side  # type: ignore[attr-defined]
            pairs = (
                [first[i] for i in over],
                [second[i] for i in over] if second is not None else None,
            )
            try:
                cut = tok(  # type: ignore[operator]
                    *pairs,
                    add_special_tokens=True,
                    truncation="only_second" if second is not None else True,
                    max_length=limit,
                )
            except Exception:  # HF raises a bare Exception ("Sequence ... too short")
                if second is None:
                    raise
                # A query that fills the window alone leaves no document to cut: cut both.
                cut = tok(  # type: ignore[operator]
                    *pairs, add_special_tokens=True, truncation="longest_first", max_length=limit
                )
            for j, i in enumerate(over):
                ids[i] = cut["input_ids"][j]
                if types is not None:
                    types[i] = cut["token_type_ids"][j]
        return Encoded(ids=ids, type_ids=types, full_lengths=lengths)

    def _cut_left_after_prefix(
        self, text: str, prefix_chars: int, limit: int
    ) -> tuple[list[int], list[int]]:
        """``text`` (prefix included) cut to ``limit`` tokens from the left of what follows
        the prefix: specials and the prefix's tokens stay. A token that starts inside the
        prefix belongs to it (offsets decide, so this holds for any fast tokenizer)."""
        enc = self.tokenizer(  # type: ignore[operator]
            text,
            add_special_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            verbose=False,
        )
        ids: list[int] = enc["input_ids"]
        types: list[int] = enc.get("token_type_ids") or [0] * len(ids)
        content = [i for i, special in enumerate(enc["special_tokens_mask"]) if not special]
        boundary = len(text[:prefix_chars].rstrip())
        head = [i for i in content if enc["offset_mapping"][i][0] < boundary]
        body = [i for i in content if enc["offset_mapping"][i][0] >= boundary]
        lead = list(range(content[0])) if content else []
        trail = list(range(content[-1] + 1, len(ids))) if content else []
        room = limit - len(lead) - len(head) - len(trail)
        if room > 0:
            keep = lead + head + body[max(0, len(body) - room) :] + trail
        else:  # a prompt as long as the window: nothing of the text fits
            keep = (lead + head)[: max(0, limit - len(trail))] + trail
        return [ids[i] for i in keep], [types[i] for i in keep]

    def tokenize(self, texts: Sequence[str], side: TruncationSide, prefix: str = "") -> Encoded:
        return self._encode(list(texts), None, side, prefix)

    def tokenize_pairs(self, query: str, docs: Sequence[str], side: TruncationSide) -> Encoded:
        return self._encode([query] * len(docs), list(docs), side)
