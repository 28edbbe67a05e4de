"""Kafka ingest against a real broker that speaks only SASL_SSL and SSL (a test CA's
certificate, PLAIN and SCRAM users; ``tests.kafka.fixtures.secure_kafka``): every
mechanism gets in; `flotilla ingest --produce` sends a file, and the Kafka source wired
from FLOTILLA_* variables consumes, stores and dead-letters it, all through the one
client builder; a wrong password, an untrusted broker certificate or a missing client
certificate fails the start naming the setting and never the secret; a plaintext
client gets nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaConnectionError

from embedder.core.errors import LinkRefused
from flotilla import ingest as ingest_command
from flotilla import wiring
from flotilla.settings import Settings
from ingest.dead_letters import ERROR_HEADER, dlq_topic
from ingest.kafka_clients import KafkaClients
from ingest.kafka_security import KafkaSecurity
from ingest.store.qdrant import QdrantStore
from tests.fakes import FakeLoader
from tests.kafka.fixtures import SASL_USERS, SecureKafka, unique_name

pytestmark = pytest.mark.slow  # starts a broker

WRONG = "wrong-Pa55word"
DOCUMENTS = 20
TLS_CLOSE_S = 0.5


@pytest.fixture(autouse=True)
async def tls_closes_finish() -> AsyncIterator[None]:
    """aiokafka closes a connection whose login failed without waiting for its TLS close,
    which needs the broker's answer: the test's loop gives it that before it ends, or the
    socket is left open and collected, with a warning, during some later test."""
    yield
    await asyncio.sleep(TLS_CLOSE_S)


def sasl(
    secure_kafka: SecureKafka, mechanism: str = "SCRAM-SHA-512", **changes: object
) -> KafkaSecurity:
    user, password = SASL_USERS[mechanism]
    given: dict[str, object] = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_username": user,
        "sasl_password": password,
        "tls_ca": secure_kafka.certificates.ca,
    }
    return KafkaSecurity.model_validate(given | changes)


async def topics(kafka: KafkaClients) -> set[str]:
    admin = kafka.admin(request_timeout_ms=10_000)
    try:
        await kafka.start(admin.start())
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def refusal(kafka: KafkaClients) -> str:
    with pytest.raises(LinkRefused) as caught:
        await topics(kafka)
    assert caught.value.retriable is False
    return caught.value.message


@pytest.mark.parametrize("mechanism", list(SASL_USERS))
async def test_each_mechanism_gets_in_over_tls(secure_kafka: SecureKafka, mechanism: str) -> None:
    kafka = KafkaClients(secure_kafka.sasl_ssl, sasl(secure_kafka, mechanism))
    assert "__consumer_offsets" in await topics(kafka)


async def test_tls_alone_with_a_client_certificate_gets_in(secure_kafka: SecureKafka) -> None:
    files = secure_kafka.certificates
    security = KafkaSecurity(
        security_protocol="SSL",
        tls_ca=files.ca,
        tls_cert=files.client_cert,
        tls_key=files.client_key,
    )
    assert "__consumer_offsets" in await topics(KafkaClients(secure_kafka.ssl, security))


# -- ingest, as the commands wire it ----------------------------------------------------


@pytest.fixture
def secured_env(
    secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch, clean_env: None, tmp_path: Path
) -> dict[str, str]:
    user, password = SASL_USERS["SCRAM-SHA-256"]
    fleet = tmp_path / "fleet.yaml"
    profile = {"cpu": {"max_batch_tokens": 512, "max_batch_requests": 16, "max_wait_ms": 1}}
    model = {"source": {"path": str(tmp_path)}, "max_tokens": 64, "profiles": profile}
    fleet.write_text(json.dumps({"models": {"alpha": model}}), encoding="utf-8")
    env = {
        "FLOTILLA_KAFKA": secure_kafka.sasl_ssl,
        "FLOTILLA_TOPIC": unique_name("secure-docs"),
        "FLOTILLA_GROUP": unique_name("g"),
        "FLOTILLA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FLOTILLA_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "FLOTILLA_KAFKA_SASL_USERNAME": user,
        "FLOTILLA_KAFKA_SASL_PASSWORD": password,
        "FLOTILLA_KAFKA_TLS_CA": str(secure_kafka.certificates.ca),
        "FLOTILLA_FLEET": str(fleet),
        "FLOTILLA_DEVICE": "cpu",
        "FLOTILLA_PROGRESS_INTERVAL_S": "60",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


async def read_topic(kafka: KafkaClients, topic: str, expected: int) -> list[object]:
    consumer = kafka.consumer(topic, auto_offset_reset="earliest", enable_auto_commit=False)
    await kafka.start(consumer.start())
    got: list[object] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < expected:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(records)
    finally:
        await consumer.stop()
    return got


async def test_ingest_over_sasl_ssl_stores_and_dead_letters(
    secured_env: dict[str, str], tmp_path: Path
) -> None:
    settings = Settings()
    assert settings.kafka_security.sasl_password is not None
    assert secured_env["FLOTILLA_KAFKA_SASL_PASSWORD"] not in repr(settings)
    topic = settings.ingest.topic
    assert topic is not None
    kafka = KafkaClients(secured_env["FLOTILLA_KAFKA"], settings.kafka_security)
    admin = kafka.admin()
    await kafka.start(admin.start())
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    lines = [json.dumps({"id": f"doc-{i}", "text": f"document {i}"}) for i in range(DOCUMENTS)]
    source_file = tmp_path / "docs.jsonl"
    source_file.write_text("\n".join([*lines, "not json"]) + "\n", encoding="utf-8")
    await ingest_command.produce(settings, source_file)  # `flotilla ingest --produce`

    store = QdrantStore(location=":memory:")
    stack = wiring.local_stack(settings, store, loader=FakeLoader())
    async with stack.store, stack.host:
        await stack.host.wait_ready()
        source = wiring.kafka_source(settings, stack.core)
        await source.start()
        try:
            async with asyncio.timeout(60):
                while source.totals.upserted + source.totals.dead_lettered < DOCUMENTS + 1:  # noqa: ASYNC110 - a counter
                    await asyncio.sleep(0.1)
        finally:
            await source.stop()
        assert (source.totals.upserted, source.totals.dead_lettered) == (DOCUMENTS, 1)
        assert await store.count(settings.ingest.collection) == DOCUMENTS
    (dead,) = await read_topic(kafka, dlq_topic(topic), 1)
    assert dict(dead.headers)[ERROR_HEADER]  # type: ignore[attr-defined]


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_wrong_password_names_the_settings_and_not_the_password(
    secure_kafka: SecureKafka, mechanism: str
) -> None:
    security = sasl(secure_kafka, mechanism, sasl_password=WRONG)
    message = await refusal(KafkaClients(secure_kafka.sasl_ssl, security))
    assert "--kafka-sasl-password (FLOTILLA_KAFKA_SASL_PASSWORD)" in message
    assert "--kafka-sasl-username" in message and mechanism in message
    assert WRONG not in message and WRONG not in repr(security)


async def test_the_source_start_fails_on_a_wrong_password(
    secured_env: dict[str, str],
) -> None:
    settings = Settings(kafka_sasl_password=WRONG)
    stack = wiring.local_stack(settings, QdrantStore(location=":memory:"), loader=FakeLoader())
    source = wiring.kafka_source(settings, stack.core)
    with pytest.raises(LinkRefused, match="FLOTILLA_KAFKA_SASL_PASSWORD"):
        await source.start()
    await source.stop()


async def test_an_untrusted_broker_certificate_names_the_ca_setting(
    secure_kafka: SecureKafka,
) -> None:
    security = sasl(secure_kafka, tls_ca=secure_kafka.certificates.other_ca)
    message = await refusal(KafkaClients(secure_kafka.sasl_ssl, security))
    assert "TLS verification" in message and "--kafka-tls-ca (FLOTILLA_KAFKA_TLS_CA)" in message


async def test_without_a_client_certificate_tls_alone_is_refused(
    secure_kafka: SecureKafka,
) -> None:
    security = KafkaSecurity(security_protocol="SSL", tls_ca=secure_kafka.certificates.ca)
    message = await refusal(KafkaClients(secure_kafka.ssl, security))
    assert "--kafka-tls-cert" in message


async def test_a_plaintext_client_gets_nothing(secure_kafka: SecureKafka) -> None:
    with pytest.raises(KafkaConnectionError):
        await topics(KafkaClients(secure_kafka.sasl_ssl))
