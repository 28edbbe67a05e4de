"""The Kafka link's security settings without a broker: what each protocol hands aiokafka
(a verifying TLS context, the SASL login with the secret's value), which combinations
are refused at once and with which settings named, and a TLS file that cannot be read."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from embedder.core.errors import LinkRefused
from ingest.kafka_clients import KafkaClients
from ingest.kafka_security import KafkaSecurity
from tests.certificates import make_certificates


def test_plaintext_hands_aiokafka_its_defaults() -> None:
    assert KafkaSecurity().client_options() == {"security_protocol": "PLAINTEXT"}


def test_sasl_ssl_hands_a_verifying_context_and_the_login(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    security = KafkaSecurity(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="carol",
        sasl_password="s3cret",
        tls_ca=files.ca,
    )
    options = security.client_options()
    context = options.pop("ssl_context")
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "carol",
        "sasl_plain_password": "s3cret",
    }
    assert "s3cret" not in repr(security) and "s3cret" not in str(security.model_dump())


async def test_every_client_is_built_with_the_security(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    kafka = KafkaClients("b:9093", KafkaSecurity(security_protocol="SSL", tls_ca=files.ca))
    consumer, producer, admin, client = (
        kafka.consumer(group_id="g"),
        kafka.producer(),
        kafka.admin(),
        kafka.client(),
    )
    for inner in (consumer._client, producer.client, admin._client, client):
        assert inner._security_protocol == "SSL"
        assert isinstance(inner._ssl_context, ssl.SSLContext)
        assert inner._bootstrap_servers == "b:9093"
    await consumer.stop()
    await producer.stop()
    await admin.close()
    await client.close()


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"security_protocol": "SASL_SSL", "sasl_username": "u"}, "--kafka-sasl-password"),
        ({"sasl_username": "u", "sasl_password": "p"}, "SASL_SSL"),
        ({"tls_ca": "ca.pem"}, "--kafka-security-protocol"),
        ({"security_protocol": "SSL", "tls_cert": "c.pem"}, "--kafka-tls-key"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_them(
    given: dict[str, object], named: str
) -> None:
    with pytest.raises(ValidationError, match=named) as refused:
        KafkaSecurity.model_validate(given)
    assert "'p'" not in str(refused.value.errors(include_input=False))


def test_an_unreadable_ca_file_names_its_setting(tmp_path: Path) -> None:
    security = KafkaSecurity(security_protocol="SSL", tls_ca=tmp_path / "missing.pem")
    with pytest.raises(LinkRefused, match=r"--kafka-tls-ca \(FLOTILLA_KAFKA_TLS_CA\)"):
        KafkaClients("b:9093", security).admin()
