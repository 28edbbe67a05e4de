"""The lexical baseline: BM25 (``bm25s``, Lucene's scoring with k1=1.5, b=0.75) over
lower-cased words with the language's stop words removed and Snowball stemming
(PyStemmer), the usual analyzer of a search engine's text field. A dense model that
cannot beat it on a set has little to offer there.

Documents that share no term with a query score 0 and are left out of its ranking
rather than ranked in arbitrary order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

LANGUAGES = {"de": "german", "en": "english"}  # stop-word list code -> Snowball stemmer


def _analyzer(language: str) -> Any:
    import Stemmer

    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {sorted(LANGUAGES)}, got {language!r}")
    return Stemmer.Stemmer(LANGUAGES[language])


def bm25_run(
    corpus: Mapping[str, str], queries: Mapping[str, str], *, k: int = 100, language: str = "de"
) -> dict[str, list[str]]:
    """Each query's top ``k`` corpus ids by BM25, best first."""
    import bm25s

    stemmer = _analyzer(language)
    ids = list(corpus)
    if not ids or not queries:
        return {qid: [] for qid in queries}

    def tokens(texts: list[str]) -> Any:
        return bm25s.tokenize(texts, stopwords=language, stemmer=stemmer, show_progress=False)

    retriever = bm25s.BM25()
    retriever.index(tokens([corpus[i] for i in ids]), show_progress=False)
    qids = list(queries)
    found, scores = retriever.retrieve(
        tokens([queries[q] for q in qids]), k=min(k, len(ids)), show_progress=False
    )
    return {
        qid: [ids[int(d)] for d, s in zip(found[row], scores[row], strict=True) if s > 0]
        for row, qid in enumerate(qids)
    }


def bm25_scores(
    passages: Sequence[str], queries: Sequence[str], *, language: str = "de"
) -> Iterator[np.ndarray]:
    """Each query's BM25 score against every passage (one array per query, in order):
    the full row, so a caller can read a given passage's score beside the top ones."""
    import bm25s

    stemmer = _analyzer(language)
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize(list(passages), stopwords=language, stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    words = bm25s.tokenize(
        list(queries), stopwords=language, stemmer=stemmer, return_ids=False, show_progress=False
    )
    for tokens in words:
        known = retriever.get_tokens_ids(list(tokens))
        if not known:  # no word of the query occurs in any passage
            yield np.zeros(len(passages), dtype=np.float32)
            continue
        yield np.asarray(retriever.get_scores_from_ids(known), dtype=np.float32)
