"""What can go wrong turning packaged weights into a model folder, one class per cause.

None is retriable: a bad or missing input stays bad until someone reinstalls a package
or fixes a file, and the message says which.
"""

from __future__ import annotations

from embedder.core.errors import FlotillaError


class ModelImportError(FlotillaError):
    """Base class: the import could not produce a model folder."""

    code = "model_import_error"


class UnknownImporter(ModelImportError):
    code = "unknown_importer"


class SourceMissing(ModelImportError):
    """An input file is not there: the package that carries it is not installed."""

    code = "import_source_missing"


class BadMagic(ModelImportError):
    """The file does not start with the format's magic bytes: it is something else."""

    code = "bad_magic"


class TruncatedFile(ModelImportError):
    """The file ends before a header field or a tensor it declares."""

    code = "truncated_file"


class UnsupportedFormat(ModelImportError):
    """A header value or tensor type this reader does not know (a newer format version)."""

    code = "unsupported_format"


class UnknownTensor(ModelImportError):
    code = "unknown_tensor"


class MissingTensor(ModelImportError):
    code = "missing_tensor"


class ShapeMismatch(ModelImportError):
    """A tensor's size disagrees with the dimensions the header declares."""

    code = "shape_mismatch"


class TokenizerMismatch(ModelImportError):
    """The tokenizer's vocabulary is not the one the weights were trained with."""

    code = "tokenizer_mismatch"


class DestinationInUse(ModelImportError):
    """The output folder holds something that is not an earlier import."""

    code = "destination_in_use"
