"""What the gateway needs to know of the settings, as one small immutable object.

The wiring (``flotilla.wiring.gateway_config``) builds it from the one settings
object; the gateway itself never imports ``flotilla``, so it stays a layer below
the commands and can be wired by anything (tests, benchmarks, another CLI).
Each message that names a limit also names the flag that changes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    version: str  # shown in the OpenAPI document
    api_keys: tuple[str, ...]  # accepted bearer tokens; empty leaves the API open
    max_body_bytes: int
    request_timeout_s: float
    max_inflight_tokens: int  # per model
    bytes_per_token: float  # for estimating a body's tokens without parsing it
    body_timeout_s: float = 10.0  # longest wait for the next piece of a request body (408)
    max_documents_per_request: int = 512  # the documents routes' batches
    ocr_max_pages: int = 64  # /v1/ocr: pages one request may ask for (413)
    ocr_max_document_bytes: int = 20_000_000  # /v1/ocr: a document's decoded size (413)
