"""The served side's client: the request it sends, the answer it reads, and a level
of closed-loop clients against a small HTTP server that answers in the contract's
shape."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from bench.generation.flotilla_side import SkipSide
from bench.ocr_data import pageset
from bench.ocr_data.pageset import Sample
from bench.ocr_sides import client, flotilla_side
from bench.ocr_sides.results import summarize


@pytest.fixture(scope="module")
def pages(gesetze: Path) -> list[Sample]:
    return pageset.build(5, seed=0, gesetze=gesetze)  # page 4 is noisy: the test server refuses it


def answer(sample: Sample) -> dict[str, object]:
    """What the served route answers for a page it reads perfectly."""
    lines = [
        {
            "text": line.text,
            "confidence": 0.99,
            "bbox": [float(v) for v in line.box],
            "polygon": [[line.box[0], line.box[1]], [line.box[2], line.box[1]],
                        [line.box[2], line.box[3]], [line.box[0], line.box[3]]],
        }
        for line in sample.lines
    ]  # fmt: skip
    page = {
        "index": 0,
        "markdown": sample.text,
        "images": [],
        "dimensions": {"dpi": None, "height": sample.height, "width": sample.width},
        "source": "ocr",
        "lines": lines,
    }
    return {
        "pages": [page],
        "model": "ppocrv5-mobile",
        "document_annotation": None,
        "usage_info": {"pages_processed": 1, "doc_size_bytes": len(sample.png)},
    }


def test_the_request_is_mistral_s_shape(pages: list[Sample]) -> None:
    request = json.loads(client.body("pp-ocr", pages[0].png))
    assert request["model"] == "pp-ocr" and request["document"]["type"] == "image_url"
    prefix, data = request["document"]["image_url"].split(",", 1)
    assert prefix == "data:image/png;base64" and base64.b64decode(data) == pages[0].png


def test_the_answer_is_read_with_boxes_as_bounds_or_polygons() -> None:
    payload = {
        "pages": [
            {"index": 1, "markdown": "second", "lines": [{"text": "second", "bbox": [1, 2, 3, 4]}]},
            {
                "index": 0,
                "markdown": "first",
                "lines": [
                    {
                        "text": "first",
                        "bbox": [[10, 20], [50, 22], [50, 40], [10, 38]],
                        "confidence": 0.5,
                    }
                ],
            },
        ]
    }
    prediction = client.parse(payload)
    assert prediction.text == "first\nsecond"
    assert [(p.text, p.box, p.confidence) for p in prediction.lines] == [
        ("first", (10, 20, 50, 40), 0.5),
        ("second", (1, 2, 3, 4), None),
    ]
    with pytest.raises(KeyError):
        client.parse({"text": "not the shape"})


@pytest.fixture
def served(pages: list[Sample]) -> Iterator[str]:
    by_png = {base64.b64encode(s.png).decode(): s for s in pages}

    async def ocr(request: web.Request) -> web.Response:
        body = await request.json()
        data = body["document"]["image_url"].split(",", 1)[1]
        sample = by_png.get(data)
        if sample is None:
            return web.json_response({"error": {"message": "not a page of the set"}}, status=400)
        await asyncio.sleep(0.01)
        if sample.condition == "noisy":
            return web.json_response({"error": {"message": "corrupt image"}}, status=422)
        return web.json_response(answer(sample))

    async def start() -> tuple[web.AppRunner, str]:
        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_post("/v1/ocr", ocr)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return runner, f"http://127.0.0.1:{port}/v1/ocr"

    loop = asyncio.new_event_loop()
    runner, url = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield url
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_a_level_sends_every_page_and_scores_the_answers(served: str, pages: list[Sample]) -> None:
    assert pages[4].condition == "noisy"
    outcomes = asyncio.run(client.run_level(served, "ocr", pages, 3, 2 * len(pages), 10.0))
    assert len(outcomes) == 10 and sorted(o.index for o in outcomes) == sorted([0, 1, 2, 3, 4] * 2)
    row = summarize("flotilla", 3, outcomes, pages)
    assert (row["ok"], row["requests"], row["errors"]) == (8, 10, {"http 422": 2})
    assert row["unanswered_pages"] == [pages[4].id]
    assert row["cer"]["all"]["cer"] == 0.0 and row["cer"]["all"]["line_cer"] == 0.0
    assert row["cer"]["all"]["pages"] == 4 and row["pages_per_s"] > 0
    assert row["pages"][pages[1].id] == {"cer": 0.0, "line_cer": 0.0, "text": pages[1].text}


def test_the_side_is_skipped_without_an_ocr_entry(tmp_path: Path) -> None:
    side = flotilla_side.FlotillaSide(None, None, 2, 10.0)
    fleet = tmp_path / "fleet.yaml"
    bundled = yaml.safe_load(Path("embedder/fleet.yaml").read_text(encoding="utf-8"))
    if not any(spec.get("task") == "ocr" for spec in bundled["models"].values()):
        with pytest.raises(SkipSide, match="no entry with task ocr"):
            flotilla_side.fleet_file(side, fleet)
    embedder = next(iter(bundled["models"]))
    named = flotilla_side.FlotillaSide(embedder, None, 2, 10.0)
    with pytest.raises(SkipSide, match="not ocr"):
        flotilla_side.fleet_file(named, fleet)
    unknown = flotilla_side.FlotillaSide("no-such-model", None, 2, 10.0)
    with pytest.raises(SkipSide, match="not in the fleet"):
        flotilla_side.fleet_file(unknown, fleet)


def test_a_fleet_s_ocr_entry_is_written_alone(tmp_path: Path) -> None:
    bundled = yaml.safe_load(Path("embedder/fleet.yaml").read_text(encoding="utf-8"))
    ocr = [name for name, spec in bundled["models"].items() if spec.get("task") == "ocr"]
    if not ocr:
        pytest.skip("the bundled fleet has no OCR entry yet")
    written = tmp_path / "one.yaml"
    name = flotilla_side.fleet_file(flotilla_side.FlotillaSide(None, None, 2, 10.0), written)
    assert name == ocr[0]
    assert list(yaml.safe_load(written.read_text(encoding="utf-8"))["models"]) == [name]
