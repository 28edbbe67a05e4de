"""The OCR route's own part: annotating a ``/v1/ocr`` body without decoding its document.

The gateway reads the model, the document's type and the pages asked for (msgspec skips
the document's base64 without building it), refuses what it can tell is wrong at once
(an unknown type, more pages than ``--ocr-max-pages``, a document whose encoded size is
already over ``--ocr-max-document-bytes``) and sizes the job in pages
(``embedder.ocr.api.estimate_tokens``). The worker decodes the document, checks its
pixels and pages for real, and writes the answer.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request

from embedder.errors import InvalidRequest, LimitExceeded, TaskNotSupported
from embedder.fleet import Fleet, ModelSpec
from embedder.jobs import ApiShape, EmbedJob, JobResult, Task, split_model
from embedder.ocr.api import BASE64_RATIO, Routing, check_routing, estimate_tokens
from gateway.annotate import default_model
from gateway.generate import Gateway


def routing(body: bytes) -> Routing:
    try:
        return msgspec.json.decode(body, type=Routing)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request body: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest("the request body nests too deep to decode") from None


def ocr_model(fleet: Fleet, name: str | None) -> ModelSpec:
    spec = default_model(fleet, Task.OCR) if name is None else fleet.get(name)
    if spec.task is not Task.OCR:
        names = [n for n, s in fleet.models.items() if s.task is Task.OCR]
        raise TaskNotSupported(
            f"model {spec.name!r} is a {spec.task} model and cannot read documents; "
            + (f"OCR models: {', '.join(names)}" if names else "the fleet has none")
        )
    return spec


class OcrRoute:
    def __init__(self, shape: ApiShape = ApiShape.MISTRAL_OCR) -> None:
        self.shape = shape

    async def job(self, gateway: Gateway, request: Request, body: bytes, now: float) -> EmbedJob:
        fields = routing(body)
        model, adapter = split_model(fields.model) if fields.model else (None, fields.adapter)
        spec = ocr_model(gateway.fleet, model)
        if adapter or fields.adapter:
            raise InvalidRequest(f"model {spec.name!r} serves no adapters: OCR runs base models")
        config = gateway.config
        check_routing(fields, config.ocr_max_pages)
        encoded = int(len(body) * BASE64_RATIO)
        if encoded > config.ocr_max_document_bytes:
            raise LimitExceeded(
                f"the document has about {encoded} bytes, over the limit of "
                f"{config.ocr_max_document_bytes}: send a smaller one, or raise "
                "--ocr-max-document-bytes (FLOTILLA_OCR_MAX_DOCUMENT_BYTES)"
            )
        return EmbedJob.new(
            spec.name,
            self.shape,
            body,
            now=now,
            timeout_s=gateway.timeout_s(request),
            bytes_per_token=config.bytes_per_token,
            priority=gateway.priority(request),
            est_tokens=estimate_tokens(fields, len(body), config.ocr_max_pages),
        )

    async def respond(self, job: EmbedJob, result: JobResult) -> JobResult:
        return result
