"""``flotilla bench ocr``'s options, and a smoke run of its rapidocr side on two
pages (the real models of the rapidocr-onnxruntime wheel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import ocr, report
from bench.ocr_data import pageset, score
from bench.ocr_sides import rapidocr_side


def test_the_defaults_are_the_issue_s_levels_and_quick_is_small() -> None:
    args = ocr.parse_args([])
    assert (args.clients, args.sides, args.pages, args.rounds) == (
        [1, 8, 16],
        ["rapidocr", "flotilla"],
        48,
        1,
    )
    quick = ocr.parse_args(["--quick", "--sides", "rapidocr"])
    assert (quick.pages, quick.clients, quick.warmup, quick.sides) == (12, [1, 4], 1, ["rapidocr"])
    with pytest.raises(SystemExit):
        ocr.parse_args(["--sides", "tesseract"])
    with pytest.raises(SystemExit):
        ocr.parse_args(["--pages", "0"])


def test_rapidocr_s_answer_becomes_lines_with_boxes() -> None:
    raw = [[[[10.0, 20.0], [90.0, 21.0], [90.0, 40.0], [10.0, 39.0]], "Hallo", 0.93]]
    prediction = rapidocr_side.to_prediction(raw)
    assert prediction.text == "Hallo"
    assert prediction.lines == (score.PredictedLine("Hallo", (10, 20, 90, 40), 0.93),)
    assert rapidocr_side.to_prediction(None) == score.Prediction("", ())


@pytest.mark.slow
def test_a_smoke_run_of_the_rapidocr_side_reads_the_pages_and_writes_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gesetze: Path
) -> None:
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    args = ["--sides", "rapidocr", "--pages", "2", "--warmup", "0", "--threads", "2"]
    result = ocr.main([*args, "--gesetze", str(gesetze)])
    (row,) = result["rows"]
    assert (row["side"], row["ok"], row["requests"], row["x_rapidocr"]) == ("rapidocr", 2, 2, 1.0)
    assert row["pages_per_s"] > 0 and row["latency_ms"]["p50"] > 0
    # a clean page is mostly read: the model is real and the boxes land on the lines
    assert row["cer"]["all"]["cer"] < 0.5 and row["cer"]["all"]["line_cer"] < 0.5
    assert set(row["cer"]["language"]) == {"de", "en"}
    written = json.loads((tmp_path / "ocr.json").read_text(encoding="utf-8"))
    assert written["machine"]["cpu"] and written["machine"]["rapidocr-onnxruntime"] == "1.4.4"
    assert written["set"]["ids"] == [s.id for s in pageset.build(2, gesetze=gesetze)]
    assert "CER de" in (tmp_path / "ocr.txt").read_text(encoding="utf-8")
