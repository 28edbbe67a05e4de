"""Closed-loop clients posting pages to an OCR route in Mistral's shape.

Request::

    {"model": "...", "document": {"type": "image_url",
                                  "image_url": "data:image/png;base64,..."}}

Answer::

    {"pages": [{"index": 0, "markdown": "text in reading order",
                "lines": [{"text": "...", "bbox": [...], "confidence": 0.98}]}], ...}

``parse`` is the one place that reads the answer, so a change of the served
contract is a change here. ``clients`` tasks share one counter: each takes the
next request ``k``, posts page ``k % len(pages)`` and, once answered, takes
the next, until ``requests`` are taken.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench.ocr_data.pageset import Sample
from bench.ocr_data.render import Box
from bench.ocr_data.score import PredictedLine, Prediction
from bench.ocr_sides.results import Outcome


def body(model: str, png: bytes) -> bytes:
    """The request's JSON bytes (built once per page, outside the timing)."""
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return json.dumps(
        {"model": model, "document": {"type": "image_url", "image_url": url}}
    ).encode()


def _box(bbox: Any) -> Box:
    """``[x0, y0, x1, y1]`` or a polygon ``[[x, y], ...]``, as axis-aligned bounds."""
    if isinstance(bbox, dict):
        bbox = [bbox[k] for k in ("x0", "y0", "x1", "y1")]
    if len(bbox) == 4 and all(isinstance(v, int | float) for v in bbox):
        x0, y0, x1, y1 = (float(v) for v in bbox)
        return int(x0), int(y0), int(x1), int(y1)
    xs = [float(p[0]) for p in bbox]
    ys = [float(p[1]) for p in bbox]
    return int(min(xs)), int(min(ys)), int(max(xs)), int(max(ys))


def parse(payload: dict[str, Any]) -> Prediction:
    """The served answer as the scorer's prediction: the pages' markdown in order
    (an image is one page), and every line with its box and confidence. Raises
    KeyError, TypeError or ValueError on an answer of another shape."""
    pages = sorted(payload["pages"], key=lambda p: int(p.get("index", 0)))
    lines = tuple(
        PredictedLine(str(line["text"]), _box(line["bbox"]), line.get("confidence"))
        for page in pages
        for line in page.get("lines", [])
    )
    return Prediction("\n".join(str(page["markdown"]) for page in pages), lines)


_JSON = {"content-type": "application/json"}


async def post(
    session: aiohttp.ClientSession, url: str, request: bytes, timeout_s: float
) -> tuple[Prediction | None, str | None]:
    try:
        async with session.post(
            url, data=request, headers=_JSON, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            if response.status != 200:
                text = (await response.text())[:300]
                return None, f"http {response.status}: {text}"
            payload = await response.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return parse(payload), None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return None, f"unexpected answer: {type(exc).__name__} {exc}: {str(payload)[:200]}"


async def run_level(
    url: str,
    model: str,
    samples: Sequence[Sample],
    clients: int,
    requests: int,
    timeout_s: float,
) -> list[Outcome]:
    counter = itertools.count()
    outcomes: list[Outcome] = []
    bodies = [body(model, s.png) for s in samples]
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while (k := next(counter)) < requests:
                index = k % len(samples)
                sent = time.perf_counter()
                prediction, error = await post(session, url, bodies[index], timeout_s)
                outcomes.append(Outcome(index, sent, time.perf_counter(), prediction, error))

        await asyncio.gather(*(client() for _ in range(clients)))
    return sorted(outcomes, key=lambda o: o.sent_s)
