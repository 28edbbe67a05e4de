"""bench.ingest's Kafka: the one --bootstrap-servers names, else a local broker; when the
local one cannot start, the benchmark says what is missing and how to go without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import ingest


def test_a_given_cluster_is_used_as_is() -> None:
    with ingest.kafka("kafka.example:9092") as bootstrap:
        assert bootstrap == "kafka.example:9092"


def test_without_the_broker_jars_it_names_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLOTILLA_KAFKA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # neither mvn nor java
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert ingest.main(["--n-docs", "8", "--reps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--bootstrap-servers HOST:PORT" in err
    assert "python -m bench.services.kafka.jars" in err
    assert "Maven (mvn) is needed" in err
