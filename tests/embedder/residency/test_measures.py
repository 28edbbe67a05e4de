"""Measures kept across processes: a model's first load in a new process makes room for
what its family measured on this device before, and a file that cannot be read is
reported and replaced, never a reason to stop."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from embedder.residency.keeper import Residents
from embedder.residency.measures import Measure, Measures
from tests.embedder.residency.test_keeper import MB, FakeDevice
from tests.embedder.tasks.embed.test_worker import until


def test_a_measure_is_read_back_by_device_and_family(tmp_path: Path) -> None:
    path = tmp_path / "residency.json"
    Measures(path, "cpu:a").put("minilm-fp32", Measure(80 * MB, 120 * MB, 0.4))
    Measures(path, "cuda:h100").put("minilm-fp32", Measure(90 * MB, 90 * MB, 0.2))
    assert Measures(path, "cpu:a").get("minilm-fp32") == Measure(80 * MB, 120 * MB, 0.4)
    assert Measures(path, "cuda:h100").get("minilm-fp32") == Measure(90 * MB, 90 * MB, 0.2)
    assert Measures(path, "cpu:a").get("e5-fp32") is None
    assert Measures(path, "cpu:b").get("minilm-fp32") is None  # another machine's CPU


def test_an_unreadable_file_is_reported_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "residency.json"
    path.write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        measures = Measures(path, "cpu:a")
    assert "cannot be read" in caplog.text and str(path) in caplog.text
    measures.put("minilm-fp32", Measure(1, 2, 0.1))
    assert json.loads(path.read_text(encoding="utf-8"))["cpu:a"]  # whole again


async def test_a_new_process_makes_room_for_what_the_last_one_measured(tmp_path: Path) -> None:
    path = tmp_path / "residency.json"
    first = FakeDevice({"big": 300})
    residents = Residents(1000, first.load, first.unload, lambda n: False, first.refuse)
    residents.track("big", pinned=False, on_demand=True, estimate=10 * MB, family="e5-onnx")
    residents.attach("cpu", first, Measures(path, "cpu:a"))
    residents.demand("big", time.time() + 10)
    await until(lambda: Measures(path, "cpu:a").get("e5-onnx") is not None)  # kept

    # A later process: the entry counts by its measure, not by its weight files' 10 MB.
    again = Residents(1000, first.load, first.unload, lambda n: False, first.refuse)
    again.track("big-2", pinned=False, on_demand=True, estimate=10 * MB, family="e5-onnx")
    again.attach("cpu", FakeDevice({}), Measures(path, "cpu:a"))
    record = again.records["big-2"]
    assert record.expected_bytes == 300 * MB and record.load_s is not None
    assert record.memory_bytes is None  # a measure of its own comes with its first load
