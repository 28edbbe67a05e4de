"""The repeat filter: a Kafka client retrying ten times a second is a line per window."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import aiokafka  # noqa: F401  (its loggers exist once it is imported)
import pytest

from flotilla.logs import RepeatFilter, quiet_repeats


def record(msg: str, *args: object, name: str = "aiokafka") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_the_same_template_passes_once_per_window_and_says_how_many_it_held() -> None:
    now = [0.0]
    repeats = RepeatFilter(window_s=30, clock=lambda: now[0])
    template = "Unable connect to node with id %s: %s"
    passed = []
    for step in range(100):  # 10 s of attempts every 100 ms, then a while later
        now[0] = step * 0.1
        passed.append(repeats.filter(record(template, 1, f"refused {step}")))
    assert passed.count(True) == 1
    now[0] = 31.0
    late = record(template, 1, "refused again")
    assert repeats.filter(late)
    assert (
        late.getMessage()
        == "Unable connect to node with id 1: refused again [and 99 more like this in 30 s]"
    )
    assert repeats.filter(record("another message"))  # other templates are their own


@pytest.fixture
def unfiltered() -> Iterator[None]:
    """The filters go again after the test: other tests read the client's logs."""
    yield
    for name in ["aiokafka", *logging.root.manager.loggerDict]:
        if name.startswith("aiokafka"):
            logger = logging.getLogger(name)
            for found in [f for f in logger.filters if isinstance(f, RepeatFilter)]:
                logger.removeFilter(found)


@pytest.mark.usefixtures("unfiltered")
def test_every_client_logger_gets_the_filter(caplog: pytest.LogCaptureFixture) -> None:
    quiet_repeats(window_s=30)
    quiet_repeats(window_s=30)  # idempotent: one filter per logger
    for name in ("aiokafka", "aiokafka.cluster", "aiokafka.consumer.group_coordinator"):
        filters = logging.getLogger(name).filters
        assert sum(isinstance(f, RepeatFilter) for f in filters) == 1, name
    with caplog.at_level(logging.ERROR, logger="aiokafka.cluster"):
        for _ in range(50):
            logging.getLogger("aiokafka.cluster").error(
                "Topic %s not found in cluster metadata", "t"
            )
    assert len(caplog.records) == 1
