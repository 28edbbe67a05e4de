"""Training a tiny random BERT for a few steps: an adapter folder peft loads, embeddings
that change, a manifest with its cost, and a resumed run that ends where an
uninterrupted one does."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers.sentence_transformer.data_collator import (
    SentenceTransformerDataCollator as Collator,
)

from lora.callbacks import CountingTrainer
from lora.config import Prices, TrainConfig
from lora.dataset import Pair, write_jsonl
from lora.manifest import MANIFEST_NAME, weights_sha256
from lora.train import BaseModelRef, prompts_of, train, training_data
from tests.gateway.conftest import hub_offline

pytestmark = pytest.mark.slow

TOPICS = ["Urlaub", "Kündigung", "Miete", "Erbschaft", "Kaufvertrag", "Haftung", "Verjährung"]


@pytest.fixture(scope="module")
def tiny(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["tiny-a"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "train.jsonl"
    rows = [
        {"query": f"{topic} {i}", "positive": f"Die Regeln über {topic} im Fall {i} und {i * 7}."}
        for i in range(6)
        for topic in TOPICS
    ]
    write_jsonl(path, rows)
    return path


def config(**overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "lora_rank": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "lora_targets": ["query", "value"],
        "train_batch_size": 8,
        "train_lr": 1e-2,
        "train_max_seq_tokens": 32,
    }
    return TrainConfig.model_validate(values | overrides)


def embed(model_dir: Path, adapter: Path | None, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    if adapter is not None:
        model.load_adapter(str(adapter))
    return np.asarray(model.encode(texts, convert_to_numpy=True))


def test_training_writes_an_adapter_that_changes_embeddings(
    tiny: Path, pairs: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import BertModel

    out = tmp_path / "adapter"
    with hub_offline():
        manifest = train(
            BaseModelRef(tiny, "tiny"), pairs, out, config(), Prices(), show_progress=False
        )
        assert {"adapter_config.json", "adapter_model.safetensors", MANIFEST_NAME} <= {
            p.name for p in out.iterdir()
        }
        assert not (out / "checkpoint").exists()
        loaded = PeftModel.from_pretrained(BertModel.from_pretrained(str(tiny)), str(out))
        assert loaded.peft_config["default"].r == 4
        texts = ["Urlaub 1", "Die Regeln über Miete im Fall 3 und 21."]
        before, after = embed(tiny, None, texts), embed(tiny, out, texts)
    assert not np.allclose(before, after, atol=1e-4)

    written = json.loads((out / MANIFEST_NAME).read_text())
    assert written["base"] == {
        "name": "tiny", "path": str(tiny), "weights_sha256": weights_sha256(tiny)
    }  # fmt: skip
    assert written["adapter"]["rank"] == 4 and written["adapter"]["targets"] == ["query", "value"]
    assert (
        written["training"]["pairs"] == 42
        and written["training"]["steps"] == manifest.training.steps
    )
    assert written["training"]["data_sha256"]
    measured, cost = written["measured"], written["cost"]
    assert measured["device"] == "cpu" and measured["tokens"] > 0 and measured["tokens_per_s"] > 0
    assert measured["wall_s"] >= measured["train_s"] > 0 and measured["tokens_per_core_s"] > 0
    assert cost["device_seconds"] == pytest.approx(measured["threads"] * measured["wall_s"])
    assert cost["usd"] == pytest.approx(
        cost["device_seconds"] / 3600 * Prices().price_cpu_core_hour_usd
    )
    assert set(written["versions"]) >= {"torch", "transformers", "peft"}
    assert measured["peak_rss_bytes"] > 2**20 and measured["peak_device_bytes"] is None
    assert written["training"]["loss"] == "mnrl"


@pytest.mark.parametrize("loss", ["cached_mnrl", "gist", "cached_gist"])
def test_the_other_losses_train_the_same_adapter_shape(
    tiny: Path, pairs: Path, tmp_path: Path, loss: str
) -> None:
    knobs = config(train_loss=loss, train_mini_batch_size=2, train_max_steps=2)
    with hub_offline():
        manifest = train(BaseModelRef(tiny), pairs, tmp_path / loss, knobs, Prices(),
                         show_progress=False)  # fmt: skip
        texts = ["Urlaub 1", "Die Regeln über Miete im Fall 3 und 21."]
        before, after = embed(tiny, None, texts), embed(tiny, tmp_path / loss, texts)
    assert manifest.training.loss == loss and manifest.training.steps == 2
    assert manifest.measured.tokens > 0 and manifest.metrics.loss_first > 0
    assert not np.allclose(before, after, atol=1e-4)


def test_steps_past_an_epoch_pass_over_the_pairs_again(
    tiny: Path, pairs: Path, tmp_path: Path
) -> None:
    """42 pairs in batches of 8 make an epoch of at most 5 steps: 8 steps run all 8,
    into a second epoch, and the progress line and the manifest say so."""
    log = io.StringIO()
    with hub_offline():
        manifest = train(BaseModelRef(tiny), pairs, tmp_path / "out", config(train_max_steps=8),
                         Prices(), progress_stream=log)  # fmt: skip
    assert manifest.training.steps == 8 and manifest.training.epochs == 2
    assert len(manifest.metrics.loss_per_epoch) == 2
    assert log.getvalue().splitlines()[-1].startswith("LoRA r=4: step 8/8 (100%), loss ")


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(
    tiny: Path, pairs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    knobs = config(train_epochs=2, train_checkpoint_steps=2)
    with hub_offline():
        whole = train(BaseModelRef(tiny), pairs, tmp_path / "whole", knobs, Prices(),
                      show_progress=False)  # fmt: skip

        real_loss = CountingTrainer.compute_loss
        calls = 0

        def crash_at_step_8(self: CountingTrainer, *args: Any, **kwargs: Any) -> object:
            nonlocal calls
            calls += 1
            if calls == 8:
                raise KeyboardInterrupt
            return real_loss(self, *args, **kwargs)

        monkeypatch.setattr(CountingTrainer, "compute_loss", crash_at_step_8)
        with pytest.raises(KeyboardInterrupt):
            train(BaseModelRef(tiny), pairs, tmp_path / "resumed", knobs, Prices(),
                  show_progress=False)  # fmt: skip
        assert (tmp_path / "resumed" / "checkpoints").is_dir()
        monkeypatch.setattr(CountingTrainer, "compute_loss", real_loss)
        resumed = train(BaseModelRef(tiny), pairs, tmp_path / "resumed", knobs, Prices(),
                        resume=True, show_progress=False)  # fmt: skip

    assert resumed.training.steps == whole.training.steps
    # the counts of the run before the crash came back with its checkpoint
    assert resumed.measured.tokens == whole.measured.tokens
    assert len(resumed.metrics.loss_per_epoch) == 2
    a = load_file(str(tmp_path / "whole" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_training_prefixes_the_base_models_prompts(
    tiny: Path, pairs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        model = SentenceTransformer(str(tiny), device="cpu")
        model.prompts = {"query": "query: ", "document": "passage: "}
        model.save(str(tmp_path / "e5-like"))
        seen: list[dict[str, Any]] = []
        real_call = Collator.__call__

        def recording(self: Collator, features: list[dict[str, Any]]) -> object:
            seen.extend(features)
            return real_call(self, features)

        monkeypatch.setattr(Collator, "__call__", recording)
        log = io.StringIO()  # not a terminal: plain lines, the last one at the end
        manifest = train(BaseModelRef(tmp_path / "e5-like"), pairs, tmp_path / "out",
                         config(train_max_steps=1), Prices(), progress_stream=log)  # fmt: skip
    assert log.getvalue().startswith("LoRA r=4: step 1/1 (100%), loss ")
    assert manifest.training.prompts == {"query": "query: ", "passage": "passage: "}
    assert len(seen) >= 8
    assert all(row["query"].startswith("query: ") for row in seen)
    assert all(row["positive"].startswith("passage: Die Regeln") for row in seen)


@pytest.mark.parametrize("batches", ["mixed", "law"])
def test_law_batches_draw_each_batch_from_one_law(
    batches: str, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two laws of 21 pairs each: 'law' batches never mix them (each batch's other
    passages are the same law's sections); 'mixed' batches do."""
    law_of = {topic: "a" if n < 3 else "b" for n, topic in enumerate(TOPICS)}
    rows = [
        {"query": f"{topic} {i}", "positive": f"Die Regeln über {topic} im Fall {i}.",
         "law": law_of[topic]}
        for i in range(6)
        for topic in TOPICS
    ]  # fmt: skip
    rows += [  # law "a" has as many pairs as "b"
        {"query": f"Nachtrag {i}", "positive": f"Ein Nachtrag Nummer {i}.", "law": "a"}
        for i in range(3)
    ]
    write_jsonl(tmp_path / "train.jsonl", rows)
    query_law = {r["query"]: r["law"] for r in rows}
    seen: list[set[str]] = []
    real_call = Collator.__call__

    def recording(self: Collator, features: list[dict[str, Any]]) -> object:
        seen.append({query_law[row["query"]] for row in features})
        return real_call(self, features)

    monkeypatch.setattr(Collator, "__call__", recording)
    with hub_offline():
        manifest = train(BaseModelRef(tiny), tmp_path / "train.jsonl", tmp_path / "out",
                         config(train_batches=batches), Prices(), show_progress=False)  # fmt: skip
    assert manifest.training.batches == batches
    assert manifest.training.steps == len(seen) >= 6  # 21 pairs a law in batches of 8
    if batches == "law":
        assert all(len(laws) == 1 for laws in seen)
        assert {law for laws in seen for law in laws} == {"a", "b"}
    else:
        assert any(len(laws) == 2 for laws in seen)


def test_law_batches_keep_mined_negatives_apart_by_law_and_shape() -> None:
    """A data set per law and row shape: a batch is of one law, and all its rows have
    negatives or none do."""
    pairs = [Pair(f"q{i}", f"p{i}", law=law) for i, law in enumerate("aabb")]
    negatives = [["n0"], [], ["n2"], ["n3"]]
    sets = training_data(pairs, {"query": "query: ", "passage": ""}, negatives, 1, "law")
    assert {name: len(rows) for name, rows in sets.items()} == {
        "a/hard": 1, "a/pairs": 1, "b/hard": 2
    }  # fmt: skip
    assert sets["b/hard"]["query"] == ["query: q2", "query: q3"]
    assert sets["b/hard"]["negative_1"] == ["n2", "n3"]
    mixed = training_data(pairs, {"query": "", "passage": ""}, negatives, 1)
    assert {name: len(rows) for name, rows in mixed.items()} == {"hard": 3, "pairs": 1}


def test_batches_are_tokenized_as_serving_tokenizes(tiny: Path) -> None:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        model = SentenceTransformer(str(tiny), device="cpu")
    model.max_seq_length = 8  # what train() sets from train_max_seq_tokens
    rows = [{"query": "kurz", "positive": "ein etwas längerer Satz über die Miete " * 3}]
    rows.append({"query": "mittel lang hier", "positive": "x"})
    batch = Collator(preprocess_fn=model.preprocess)(rows)
    # the model's own tokenizer, cut where serving cuts it
    expected = model.tokenizer([r["positive"] for r in rows], truncation=True, max_length=8)
    for row, ids in enumerate(expected["input_ids"]):
        assert batch["positive_input_ids"][row][: len(ids)].tolist() == ids
        assert int(batch["positive_attention_mask"][row].sum()) == len(ids)


def test_prompt_names_follow_sentence_transformers() -> None:
    class WithPrompts:
        def __init__(self) -> None:
            self.prompts = {"query": "query: ", "document": "", "passage": "passage: "}

    assert prompts_of(WithPrompts()) == {"query": "query: ", "passage": "passage: "}
    assert prompts_of(object()) == {"query": "", "passage": ""}
