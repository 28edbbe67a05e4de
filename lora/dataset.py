"""The files a LoRA run reads and writes: training pairs, and a retrieval set in BEIR's
layout (a corpus, queries and graded relevance judgements).

``train.jsonl``   one pair a line: ``{"query", "positive", "id", "law", "kind"}``; ``id``,
                  ``law`` and ``kind`` are optional
``corpus.jsonl``  one passage a line: ``{"id", "text", "metadata"}``; it is also a valid
                  ``flotilla ingest --from`` file
``queries.jsonl`` one query a line: ``{"id", "text"}``
``qrels.tsv``     ``query-id<TAB>corpus-id<TAB>score`` after a header line, as BEIR
                  writes it; a score above 0 means relevant

Readers also take BEIR's own ``_id`` key and qrels as JSON lines
(``{"query-id", "corpus-id", "score"}``), so a BEIR data set evaluates as it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Qrels = dict[str, dict[str, int]]  # query id -> corpus id -> relevance grade


class DatasetError(ValueError):
    """A data file is missing or does not follow the format above."""


@dataclass(frozen=True, slots=True)
class Pair:
    query: str
    positive: str
    id: str = ""
    law: str = ""
    kind: str = "heading"  # how lora.pairs made it: heading, paragraph or reference


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object")
            yield number, row


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_pairs(path: Path) -> list[Pair]:
    pairs = []
    for number, row in _lines(path):
        query, positive = row.get("query"), row.get("positive")
        if not (isinstance(query, str) and isinstance(positive, str) and query and positive):
            raise DatasetError(f"{path}:{number}: a pair needs non-empty 'query' and 'positive'")
        pairs.append(
            Pair(
                query,
                positive,
                str(row.get("id", "")),
                str(row.get("law", "")),
                str(row.get("kind", "heading")),
            )
        )
    if not pairs:
        raise DatasetError(f"{path} holds no pairs")
    return pairs


def _texts(path: Path, what: str) -> dict[str, str]:
    texts: dict[str, str] = {}
    for number, row in _lines(path):
        key = row.get("id", row.get("_id"))
        text = row.get("text")
        if key is None or not isinstance(text, str):
            raise DatasetError(f"{path}:{number}: a {what} needs 'id' (or '_id') and 'text'")
        texts[str(key)] = text
    return texts


def read_corpus(path: Path) -> dict[str, str]:
    return _texts(path, "passage")


def read_queries(path: Path) -> dict[str, str]:
    return _texts(path, "query")


def read_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    if path.suffix == ".jsonl":
        for number, row in _lines(path):
            try:
                qid, cid, score = str(row["query-id"]), str(row["corpus-id"]), int(row["score"])
            except (KeyError, TypeError, ValueError) as exc:
                raise DatasetError(f"{path}:{number}: bad judgement: {exc}") from exc
            qrels.setdefault(qid, {})[cid] = score
        return qrels
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        fields = line.split("\t")
        if not line.strip() or (number == 1 and fields[0] == "query-id"):
            continue
        if len(fields) != 3:
            raise DatasetError(f"{path}:{number}: expected query-id, corpus-id and score")
        try:
            qrels.setdefault(fields[0], {})[fields[1]] = int(fields[2])
        except ValueError as exc:
            raise DatasetError(f"{path}:{number}: the score is not an integer") from exc
    return qrels


def write_qrels(path: Path, qrels: Qrels) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for qid, docs in qrels.items():
            for cid, score in docs.items():
                out.write(f"{qid}\t{cid}\t{score}\n")
