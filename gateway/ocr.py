"""The OCR route's own part: annotating a ``/v1/ocr`` body without decoding its document.

The gateway reads the model, the document's type and the pages asked for (msgspec skips
the document's base64 without building it), refuses what it can tell is wrong at once
(an unknown type, more pages than ``--ocr-max-pages``, a document whose encoded size is
already over ``--ocr-max-document-bytes``) and sizes the job in pages
(``embedder.tasks.ocr.api.estimate_tokens``). The worker decodes the document, checks its
pixels and pages for real, and writes the answer.
"""

from __future__ import annotations

from starlette.requests import Request

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.core.jobs import ApiShape, Job, JobResult, Task
from embedder.core.rawjson import decode_struct
from embedder.tasks.ocr.api import BASE64_RATIO, Routing, check_routing, estimate_tokens
from gateway.annotate import model_for, requested
from gateway.generate import Gateway


class OcrRoute:
    def __init__(self, shape: str = ApiShape.MISTRAL_OCR) -> None:
        self.shape = shape

    async def job(self, gateway: Gateway, request: Request, body: bytes, now: float) -> Job:
        fields = decode_struct(body, Routing)
        model, adapter = requested(fields.model, fields.adapter)
        spec = model_for(gateway.fleet, model, Task.OCR, "read documents")
        if adapter is not None:
            raise InvalidRequest(f"model {spec.name!r} serves no adapters: OCR runs base models")
        config = gateway.config
        check_routing(fields, config.ocr.max_pages)
        encoded = int(len(body) * BASE64_RATIO)
        if encoded > config.ocr.max_document_bytes:
            raise LimitExceeded(
                f"the document has about {encoded} bytes, over the limit of "
                f"{config.ocr.max_document_bytes}: send a smaller one, or raise "
                "--ocr-max-document-bytes (FLOTILLA_OCR_MAX_DOCUMENT_BYTES)"
            )
        return Job.new(
            spec.name,
            self.shape,
            body,
            now=now,
            timeout_s=gateway.timeout_s(request),
            bytes_per_token=config.bytes_per_token,
            priority=gateway.priority(request),
            est_tokens=estimate_tokens(fields, len(body), config.ocr.max_pages),
        )

    async def respond(self, job: Job, result: JobResult) -> JobResult:
        return result
