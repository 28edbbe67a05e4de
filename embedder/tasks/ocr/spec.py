"""An OCR model's fleet entry and profile: a PP-OCR detector and recognizer pair."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from embedder.core.fleet import DeviceKind, ModelSpec, Profile


class OcrProfile(Profile):
    """How an OCR model runs on one kind of device: its round budget and pass shapes."""

    max_batch_tokens: int = Field(
        default=8192,
        gt=0,
        description="Estimated tokens a round takes (a page counts 1,000): pages read, "
        "detected and recognized together.",
    )
    ocr_detect_max_side: int = Field(
        default=1280,
        ge=32,
        description="A page is scaled down until its longer side is at most this many "
        "pixels before detection (lines are still read from the full-resolution page). "
        "Larger finds smaller print and costs detection time with the square of it.",
    )
    ocr_detect_pixels: int = Field(
        default=2_000_000,
        gt=0,
        description="Padded pixels per detection pass; pages of similar shape share a "
        "pass up to this. Small on a CPU (cache), large on a GPU; one page over it runs alone.",
    )
    ocr_recognize_lines: int = Field(
        default=32,
        gt=0,
        description="Text lines per recognition pass, from every page and request the "
        "worker holds. More lines per pass amortize its cost; past a point a CPU gains "
        "nothing and a pass holds the device longer.",
    )
    ocr_recognize_width_ratio: float = Field(
        default=2.0,
        ge=1.0,
        description="Lines share a recognition pass only while the widest is at most "
        "this many times the narrowest (each is padded to the widest). Lower wastes less on "
        "padding, higher makes fewer, fuller passes.",
    )


class OcrParts(BaseModel):
    """An OCR model's detector and character set beside its recognizer (the source's
    'file'): a PP-OCR detection/recognition pair of ONNX files. Paths are relative to the
    source folder (or absolute); thresholds are PaddleOCR's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    detector: str = Field(description="The text detector (DB), an ONNX file.")
    characters: str | None = Field(
        default=None,
        description="The recognizer's character dictionary, one character a line; None "
        "reads it from the recognizer's ONNX metadata ('character', as PaddleOCR exports).",
    )
    detector_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    detector_std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    line_height: int = Field(default=48, gt=0, description="The recognizer's input height.")
    pixel_threshold: float = Field(
        default=0.3, gt=0, lt=1, description="Detection map value that counts as text."
    )
    box_threshold: float = Field(
        default=0.5, gt=0, lt=1, description="Mean detection score a line box needs."
    )
    unclip_ratio: float = Field(
        default=1.6, gt=0, description="How far a detected box is grown to cover its line."
    )
    min_confidence: float = Field(
        default=0.5, ge=0, le=1, description="Lines read with less confidence are dropped."
    )


class OcrSpec(ModelSpec):
    """An OCR model: its recognizer is the source's 'file'; 'ocr' names the detector."""

    profile_type: ClassVar[type[Profile]] = OcrProfile

    task: Literal["ocr"] = "ocr"
    ocr: OcrParts = Field(
        description="The detector and characters beside the recognizer, which is the "
        "source's 'file'."
    )
    profiles: dict[DeviceKind, OcrProfile] = Field(default_factory=dict)  # type: ignore[assignment]

    @model_validator(mode="after")
    def _recognizer(self) -> OcrSpec:
        if self.source.file is None:
            raise ValueError("an ocr model needs its recognizer as the source's 'file'")
        return self

    def profile(self, device: DeviceKind) -> OcrProfile:
        return self.profiles.get(device) or self.profiles.get("cpu") or OcrProfile()
