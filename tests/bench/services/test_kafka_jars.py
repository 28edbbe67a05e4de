"""The broker's jar cache: keyed by the pins in the pom, not by its prose; a missing Maven
is named, with the directory it would fill."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.services.kafka import jars


def test_the_shipped_pom_names_the_kafka_version() -> None:
    assert jars.kafka_version() == jars.kafka_version(jars.POM)
    assert jars.kafka_version().count(".") == 2


def test_a_reworded_comment_keeps_the_cache_a_changed_pin_does_not(tmp_path: Path) -> None:
    text = jars.POM.read_text()
    reworded = tmp_path / "reworded.xml"
    reworded.write_text(text.replace("<!--", "<!-- reworded\n", 1))
    bumped = tmp_path / "bumped.xml"
    version = jars.kafka_version()
    bumped.write_text(text.replace(f">{version}<", ">0.0.1<"))
    assert jars._digest(reworded) == jars._digest(jars.POM)
    assert jars._digest(bumped) != jars._digest(jars.POM)


def test_without_maven_the_error_names_it_and_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOTILLA_KAFKA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn on it
    with pytest.raises(jars.KafkaSetupError, match=r"Maven \(mvn\) is needed") as caught:
        jars.ensure_jars()
    assert str(jars.libs_dir()) in str(caught.value)
