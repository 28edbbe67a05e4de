"""A deterministic corpus of real English passages with mixed lengths.

Source: documentation text that ships with the Python interpreter itself, so
nothing is downloaded and the corpus is the same on every machine running the
same Python version:

- ``pydoc_data.topics``: the language reference topics that ``help()`` and
  ``pydoc`` show (about 460k characters of prose on Python 3.11);
- the docstrings of a fixed list of standard-library modules and of their
  public classes, functions and methods (``STDLIB_MODULES``), read from the
  source files with ``ast``: nothing is imported, so the corpus does not
  depend on what the caller imported before (C modules have no source and
  add nothing).

Paragraphs that look like code (indented blocks, ``>>>`` prompts, grammar
rules, mostly symbols) are dropped; the rest is split into sentences. Passage
lengths, counted in the model's own tokens including ``[CLS]`` and ``[SEP]``,
are drawn from ``LENGTH_MIX`` with a fixed seed: many short (queries, titles),
some long (documents, up to 512 tokens, beyond the model's 256 limit so that
truncation is exercised). A passage is filled with whole sentences from a
shuffled stream; when no upcoming sentence fits the room left, one of them is
cut at a word boundary; a passage never exceeds its target and, with the
default corpus, meets it exactly.

``python -m bench.texts`` prints the corpus statistics and a few samples.
"""

from __future__ import annotations

import argparse
import ast
import functools
import random
import re
import statistics
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer

SEED = 20261129
LOOKAHEAD = 64  # sentences considered for the room left in a passage
# (share, shortest, longest) in model tokens, [CLS] and [SEP] included.
LENGTH_MIX: tuple[tuple[float, int, int], ...] = (
    (0.40, 8, 32),  # queries, titles, short questions
    (0.30, 32, 128),  # paragraphs
    (0.20, 128, 256),  # long paragraphs, short documents
    (0.10, 256, 512),  # documents cut to the model's limit
)
STDLIB_MODULES = (
    "abc",
    "argparse",
    "ast",
    "asyncio.base_events",
    "asyncio.events",
    "asyncio.futures",
    "asyncio.locks",
    "asyncio.queues",
    "asyncio.streams",
    "asyncio.subprocess",
    "asyncio.tasks",
    "base64",
    "bdb",
    "bisect",
    "bz2",
    "calendar",
    "cmd",
    "code",
    "codecs",
    "collections",
    "concurrent.futures._base",
    "concurrent.futures.process",
    "concurrent.futures.thread",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email.message",
    "email.parser",
    "email.utils",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html.parser",
    "http.client",
    "http.cookiejar",
    "http.cookies",
    "http.server",
    "imaplib",
    "importlib",
    "importlib.abc",
    "importlib.metadata",
    "importlib.resources",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "json.decoder",
    "json.encoder",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "logging.handlers",
    "lzma",
    "mailbox",
    "mimetypes",
    "multiprocessing.connection",
    "multiprocessing.context",
    "multiprocessing.managers",
    "multiprocessing.pool",
    "multiprocessing.queues",
    "netrc",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "pprint",
    "profile",
    "pstats",
    "py_compile",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "stat",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "symtable",
    "sysconfig",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "trace",
    "traceback",
    "tracemalloc",
    "types",
    "typing",
    "unittest.case",
    "unittest.loader",
    "unittest.mock",
    "unittest.result",
    "unittest.runner",
    "urllib.parse",
    "urllib.request",
    "urllib.response",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "wsgiref.handlers",
    "wsgiref.simple_server",
    "xml.dom.minidom",
    "xml.etree.ElementTree",
    "xml.sax.handler",
    "xmlrpc.client",
    "xmlrpc.server",
    "zipapp",
    "zipfile",
    "zipimport",
    "zoneinfo",
)

_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\"'][.!?])\s+(?=[A-Z])")
_CODEY = re.compile(r">>>|::=|\.\.\. |\{\}|==|!=|->|\w+\(.*\)\s*$|^\s*[-*=~^]{3,}")


def model_folder() -> Path:
    """The folder of the fleet's default embedding model (all-MiniLM-L6-v2)."""
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet()
    return fleet.get(fleet.default_model).source.resolve()


@functools.cache
def tokenizer(folder: Path | None = None) -> Tokenizer:
    """The model's fast tokenizer with its stored padding and truncation switched off."""
    tok = Tokenizer.from_file(str((folder or model_folder()) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


# -- sentences --------------------------------------------------------------


def _documents() -> list[str]:
    import pydoc_data.topics

    documents = [pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)]
    documents.extend(_docstrings())
    return documents


def _source(module_name: str) -> str | None:
    """A standard-library module's source, found on disk without importing it."""
    base = Path(sysconfig.get_paths()["stdlib"]).joinpath(*module_name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None  # a C module, or an interpreter built without it


def _docstrings() -> Iterator[str]:
    """Docstrings of each module, its public functions and classes and their public
    methods, read from the source with ``ast``: never from imported objects, which
    other libraries may have patched (torch replaces some of ``inspect``'s)."""
    for module_name in STDLIB_MODULES:
        source = _source(module_name)
        if source is None:
            continue
        tree = ast.parse(source)
        yield ast.get_docstring(tree) or ""
        for node in _public(tree.body):
            yield ast.get_docstring(node) or ""
            if isinstance(node, ast.ClassDef):
                yield from (ast.get_docstring(m) or "" for m in _public(node.body))


def _public(
    body: list[ast.stmt],
) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    defs = [
        node
        for node in body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("_")
    ]
    return sorted(defs, key=lambda node: node.name)  # stable: same-named defs keep order


def _is_prose(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    if not lines or any(line.startswith((" ", "\t")) for line in lines):
        return False  # indented: code, grammar or a literal block
    text = " ".join(lines)
    if _CODEY.search(text):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return letters >= 0.8 * len(text)


def _is_sentence(sentence: str) -> bool:
    words = sentence.split()
    return (
        4 <= len(words) <= 120
        and sentence[0].isupper()
        and sentence[-1] in ".!?"
        and not any(len(w) > 40 for w in words)
    )


@functools.cache
def sentences() -> tuple[str, ...]:
    """Unique prose sentences from the bundled documentation, in a fixed order."""
    seen: set[str] = set()
    found: list[str] = []
    for document in _documents():
        for paragraph in re.split(r"\n\s*\n", document):
            if not _is_prose(paragraph.strip("\n")):
                continue
            text = " ".join(paragraph.replace("*", "").split())
            for sentence in _SENTENCE_END.split(text):
                if _is_sentence(sentence) and sentence not in seen:
                    seen.add(sentence)
                    found.append(sentence)
    return tuple(found)


# -- passages ---------------------------------------------------------------


def target_lengths(n: int, seed: int = SEED) -> list[int]:
    """``n`` passage lengths in model tokens, drawn from ``LENGTH_MIX``."""
    rng = random.Random(seed)
    shares = [share for share, _, _ in LENGTH_MIX]
    lengths: list[int] = []
    for _ in range(n):
        (_, low, high) = rng.choices(LENGTH_MIX, weights=shares)[0]
        lengths.append(rng.randint(low, high))
    return lengths


def _prefix(sentence: str, encoding: Encoding, budget: int) -> tuple[str, int]:
    """The longest prefix of ``sentence`` ending at a word boundary with at most
    ``budget`` tokens, and its token count."""
    offsets = encoding.offsets
    for i in range(min(budget, len(offsets) - 1), 0, -1):
        start = offsets[i][0]
        if start > 0 and sentence[start - 1].isspace():
            return sentence[:start].rstrip(), i
    return "", 0


def _shuffled(count: int, rng: random.Random) -> Iterator[int]:
    """Sentence indices in a fresh random order each pass, for as long as asked."""
    while True:
        order = list(range(count))
        rng.shuffle(order)
        yield from order


@dataclass(frozen=True, slots=True)
class Corpus:
    texts: list[str]
    lengths: list[int]  # model tokens with [CLS] and [SEP], before truncation

    def truncated_lengths(self, max_tokens: int) -> list[int]:
        return [min(n, max_tokens) for n in self.lengths]


def build(n: int, seed: int = SEED, folder: Path | None = None) -> Corpus:
    """``n`` passages with lengths drawn by ``target_lengths(n, seed)``.

    Whole sentences fill a passage, the first of the next ``LOOKAHEAD`` that fits
    taken each time; when none fits, the passage ends on the word-boundary prefix of
    one of them that comes closest (never over the target; short of it only when no
    prefix fits exactly).
    """
    tok = tokenizer(folder)
    pool = sentences()
    encodings = tok.encode_batch(list(pool), add_special_tokens=False)
    sizes = [len(e.ids) for e in encodings]
    order = _shuffled(len(pool), random.Random(seed + 1))
    window = [next(order) for _ in range(LOOKAHEAD)]
    texts: list[str] = []
    lengths: list[int] = []
    for target in target_lengths(n, seed):
        budget = target - 2  # [CLS] and [SEP]
        parts: list[str] = []
        while budget > 0:
            pick = next((k for k, i in enumerate(window) if sizes[i] <= budget), None)
            if pick is not None:
                i = window.pop(pick)
                parts.append(pool[i])
                budget -= sizes[i]
            else:  # end on the word-boundary prefix that comes closest to the target
                cuts = [_prefix(pool[i], encodings[i], budget) for i in window]
                best = max(range(len(cuts)), key=lambda k: cuts[k][1])
                piece, size = cuts[best]
                window.pop(best)
                if piece:
                    parts.append(piece)
                    budget -= size
            window.append(next(order))
            if pick is None:
                break
        texts.append(" ".join(parts))
        lengths.append(target - budget)
    return Corpus(texts, lengths)


def describe(lengths: Sequence[int]) -> dict[str, float]:
    ordered = sorted(lengths)

    def pct(p: float) -> float:
        return float(ordered[min(len(ordered) - 1, int(p * len(ordered)))])

    return {
        "count": len(ordered),
        "total": float(sum(ordered)),
        "mean": statistics.fmean(ordered),
        "min": float(ordered[0]),
        "p50": pct(0.5),
        "p90": pct(0.9),
        "max": float(ordered[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n-texts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    corpus = build(args.n_texts, args.seed)
    tok = tokenizer()
    actual = [len(e.ids) for e in tok.encode_batch(corpus.texts)]
    mismatches = sum(a != b for a, b in zip(actual, corpus.lengths, strict=True))
    print(f"{len(sentences())} sentences in the pool")
    print(f"lengths: {describe(corpus.lengths)}")
    print(f"truncated to 256: {describe(corpus.truncated_lengths(256))}")
    print(f"passages whose re-tokenized length differs from the recorded one: {mismatches}")
    for text in corpus.texts[:5]:
        print("-", text[:200])


if __name__ == "__main__":
    main()
