"""The delivery channels against real receivers on loopback (`receivers`): an HTTP server
for the webhooks, aiosmtpd for email (STARTTLS with a certificate made here, TLS from the
start, plain SMTP).

Every failure is checked for what it must not say: the webhook's secret path, the URL, the
SMTP password.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rastro_assets.alerts.channels import (
    DeliveryError,
    EmailChannel,
    Message,
    WebhookChannel,
    channels_from_env,
)
from rastro_assets.settings import SettingsError
from rastro_assets_tests.alerts.receivers import (
    SMTP_PASSWORD,
    SMTP_PASSWORD_IN_URL,
    SMTP_USER,
    WEBHOOK_SECRET_PATH,
    SmtpReceiver,
    WebhookReceiver,
    closed_port,
    smtp_receiver,
    webhook_receiver,
)

MESSAGE = Message(
    incident_key="token:conn_a",
    event="opened",
    subject="[rastro] OPEN: connection conn_a's token is invalid",
    text="Connection conn_a's Meta token is invalid.\nReconnect it: rastro connect conn_a",
)


# --- webhooks ---------------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """An HTTP server on loopback that records each JSON body and answers `status`."""
    with webhook_receiver() as hook:
        yield hook


def assert_no_secret(error: BaseException, *secrets: str) -> None:
    for shown in (str(error), repr(error)):
        for secret in secrets:
            assert secret not in shown


def test_a_webhook_receives_the_text_as_json(receiver: WebhookReceiver):
    channel = WebhookChannel(receiver.url)
    channel.send(MESSAGE)
    assert len(receiver.bodies) == 1
    body = receiver.bodies[0]
    assert body["text"] == MESSAGE.text
    assert body["rastro_event"] == "opened"
    assert body["rastro_incident"] == "token:conn_a"
    assert receiver.content_types == ["application/json"]


def test_a_webhook_is_known_by_a_label_and_a_hash_never_its_url(receiver: WebhookReceiver):
    channel = WebhookChannel(receiver.url, position=2)
    assert channel.label == "webhook 2 (127.0.0.1)"
    assert channel.channel_id.startswith("webhook:") and len(channel.channel_id) == 20
    assert WebhookChannel(receiver.url).channel_id == channel.channel_id
    for shown in (repr(channel), str(channel), channel.label, channel.channel_id):
        assert WEBHOOK_SECRET_PATH not in shown and "s3cr3t" not in shown


def test_a_webhook_answering_500_is_a_delivery_error_without_the_url(receiver: WebhookReceiver):
    receiver.status = 500
    with pytest.raises(DeliveryError) as caught:
        WebhookChannel(receiver.url).send(MESSAGE)
    assert str(caught.value) == "webhook 1 (127.0.0.1): HTTP 500"
    assert_no_secret(caught.value, receiver.url, WEBHOOK_SECRET_PATH, "s3cr3t")


def test_a_webhook_redirect_is_not_followed(receiver: WebhookReceiver):
    receiver.status = 302
    with pytest.raises(DeliveryError, match="HTTP 302"):
        WebhookChannel(receiver.url).send(MESSAGE)
    # One POST, and the receiver files a body it answered 302 under `refused`.
    assert receiver.bodies == [] and len(receiver.refused) == 1


def test_a_webhook_on_a_closed_port_is_refused_without_the_url():
    url = f"http://127.0.0.1:{closed_port()}{WEBHOOK_SECRET_PATH}"
    with pytest.raises(DeliveryError) as caught:
        WebhookChannel(url).send(MESSAGE)
    assert "connection refused" in str(caught.value)
    assert str(caught.value).startswith("webhook 1 (127.0.0.1): ")
    assert_no_secret(caught.value, url, WEBHOOK_SECRET_PATH, "s3cr3t")
    # No chained exception carries the URL into a traceback either.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_silent_webhook_times_out_without_the_url():
    # Accepts the connection (the backlog) but never answers.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}{WEBHOOK_SECRET_PATH}"
        with pytest.raises(DeliveryError) as caught:
            WebhookChannel(url, timeout=0.2).send(MESSAGE)
    assert str(caught.value) == "webhook 1 (127.0.0.1): timed out"
    assert_no_secret(caught.value, url, WEBHOOK_SECRET_PATH)


# --- email ------------------------------------------------------------------------------------


@dataclass
class Certificate:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


@pytest.fixture
def certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Certificate:
    """A self-signed certificate for 127.0.0.1 and localhost, trusted by
    `ssl.create_default_context()` for the test through SSL_CERT_FILE."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    paths = Certificate(cert=tmp_path / "cert.pem", key=tmp_path / "key.pem")
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(paths.cert))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return paths


def smtp_login_receiver(**tls: Any) -> AbstractContextManager[SmtpReceiver]:
    """A receiver that checks the login `SMTP_USER` / `SMTP_PASSWORD` when the client offers
    one but does not require it; `tls` goes to aiosmtpd (`tls_context=` or `ssl_context=`,
    and `auth_require_tls=`)."""
    return smtp_receiver(user=SMTP_USER, password=SMTP_PASSWORD, auth_required=False, **tls)


def test_email_over_starttls_with_a_login_arrives(certificate: Certificate):
    with smtp_login_receiver(
        tls_context=certificate.server_context(), auth_require_tls=True
    ) as smtp:
        channel = EmailChannel(smtp.url(), ["a@x.com", "b@y.com"])
        channel.send(MESSAGE)

    [mail] = smtp.messages
    assert mail.tls and mail.authenticated
    # The user is an address, so it is the sender by default.
    assert mail.mail_from == SMTP_USER
    assert mail.rcpt_tos == ["a@x.com", "b@y.com"]
    text = mail.raw.decode()
    assert f"Subject: {MESSAGE.subject}" in text
    assert "To: a@x.com, b@y.com" in text
    assert f"From: {SMTP_USER}" in text
    assert MESSAGE.text in text.replace("\r\n", "\n")


def test_email_with_a_wrong_password_names_the_refusal_not_the_password(
    certificate: Certificate,
):
    with smtp_login_receiver(
        tls_context=certificate.server_context(), auth_require_tls=True
    ) as smtp:
        url = smtp.url(password="wr0ng-s3cret")
        channel = EmailChannel(url, ["a@x.com"])
        with pytest.raises(DeliveryError) as caught:
            channel.send(MESSAGE)
    assert "SMTPAuthenticationError 535" in str(caught.value)
    assert str(caught.value).startswith(f"email to a@x.com via 127.0.0.1:{smtp.port}: ")
    assert_no_secret(caught.value, "wr0ng-s3cret", url)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert smtp.messages == []


def test_email_over_an_untrusted_certificate_is_refused(
    certificate: Certificate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with smtp_receiver(tls_context=certificate.server_context()) as smtp:
        # An empty trust store: the server's certificate is no longer trusted.
        empty = tmp_path / "empty.pem"
        empty.write_text("")
        monkeypatch.setenv("SSL_CERT_FILE", str(empty))
        with pytest.raises(DeliveryError, match="SSLCertVerificationError"):
            EmailChannel(smtp.url(), ["a@x.com"]).send(MESSAGE)
    assert smtp.messages == []


def test_email_over_smtps_arrives(certificate: Certificate):
    with smtp_login_receiver(
        ssl_context=certificate.server_context(), auth_require_tls=False
    ) as smtp:
        channel = EmailChannel(smtp.url("smtps"), ["a@x.com"], sender="ops@rastro.test")
        assert channel.label == f"email to a@x.com via 127.0.0.1:{smtp.port}"
        channel.send(MESSAGE)
    [mail] = smtp.messages
    assert mail.tls and mail.authenticated
    assert mail.mail_from == "ops@rastro.test"
    assert mail.rcpt_tos == ["a@x.com"]


def test_plain_smtp_on_loopback_without_credentials_delivers():
    with smtp_receiver() as smtp:
        channel = EmailChannel(smtp.url(), ["a@x.com"])
        channel.send(MESSAGE)
    [mail] = smtp.messages
    assert not mail.tls
    assert mail.mail_from.startswith("rastro@")
    assert MESSAGE.subject in mail.raw.decode()


def non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def test_a_password_is_not_sent_in_clear_to_a_remote_server_without_starttls():
    # A server on this machine's own non-loopback address stands for a remote one: it offers
    # no STARTTLS, so the channel must refuse before AUTH.
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    with smtp_receiver(host=address) as smtp:
        url = f"smtp://user:{SMTP_PASSWORD_IN_URL}@{address}:{smtp.port}"
        with pytest.raises(DeliveryError, match="offers no STARTTLS") as caught:
            EmailChannel(url, ["a@x.com"]).send(MESSAGE)
    assert_no_secret(caught.value, SMTP_PASSWORD_IN_URL, SMTP_PASSWORD, url)
    assert smtp.messages == []


def test_an_smtp_server_on_a_closed_port_is_a_delivery_error():
    url = f"smtp://user:{SMTP_PASSWORD_IN_URL}@127.0.0.1:{closed_port()}"
    channel = EmailChannel(url, ["a@x.com"])
    with pytest.raises(DeliveryError, match="connection refused") as caught:
        channel.send(MESSAGE)
    assert_no_secret(caught.value, SMTP_PASSWORD_IN_URL, SMTP_PASSWORD, url)
    assert SMTP_PASSWORD_IN_URL not in repr(channel) and "user" not in repr(channel)


# --- channels_from_env ------------------------------------------------------------------------


def test_nothing_set_is_no_channel():
    assert channels_from_env({}) == []
    assert (
        channels_from_env({"RASTRO_ALERT_WEBHOOK_URLS": " , ", "RASTRO_ALERT_SMTP_URL": ""}) == []
    )


def test_the_environment_names_webhooks_in_order_then_email():
    env = {
        "RASTRO_ALERT_WEBHOOK_URLS": (
            " https://hooks.slack.com/services/T1/B1/aaa , ,"
            "https://example.webhook.office.com/webhookb2/bbb,  "
        ),
        "RASTRO_ALERT_SMTP_URL": "smtp://bot:pw@smtp.example.com",
        "RASTRO_ALERT_EMAIL_TO": "a@x.com, b@y.com,",
    }
    channels = channels_from_env(env, timeout=3.0)
    assert [channel.label for channel in channels] == [
        "webhook 1 (hooks.slack.com)",
        "webhook 2 (example.webhook.office.com)",
        "email to a@x.com, b@y.com via smtp.example.com:587",
    ]
    assert isinstance(channels[0], WebhookChannel) and isinstance(channels[2], EmailChannel)
    assert channels[0].channel_id == (
        "webhook:" + sha256_12("https://hooks.slack.com/services/T1/B1/aaa")
    )
    assert channels[2].channel_id == (
        "email:" + sha256_12("smtp://bot:pw@smtp.example.com|a@x.com,b@y.com")
    )
    assert len({channel.channel_id for channel in channels}) == 3


def test_smtps_defaults_to_port_465():
    [channel] = channels_from_env(
        {"RASTRO_ALERT_SMTP_URL": "smtps://smtp.example.com", "RASTRO_ALERT_EMAIL_TO": "a@x.com"}
    )
    assert channel.label == "email to a@x.com via smtp.example.com:465"


def sha256_12(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


WEBHOOK_SECRET = "https://hooks.example.com/s3cr3t"
SMTP_SECRET = "smtp://bot:hunter2@smtp.example.com:587"


@pytest.mark.parametrize(
    ("env", "variable", "secrets"),
    [
        (
            {"RASTRO_ALERT_WEBHOOK_URLS": f"{WEBHOOK_SECRET}, ftp://files.example.com/s3cr3t"},
            "RASTRO_ALERT_WEBHOOK_URLS",
            ("s3cr3t", "files.example.com"),
        ),
        (
            {"RASTRO_ALERT_WEBHOOK_URLS": "hooks.example.com/s3cr3t"},
            "RASTRO_ALERT_WEBHOOK_URLS",
            ("s3cr3t",),
        ),
        (
            {"RASTRO_ALERT_WEBHOOK_URLS": "https:///s3cr3t"},
            "RASTRO_ALERT_WEBHOOK_URLS",
            ("s3cr3t",),
        ),
        (
            {"RASTRO_ALERT_WEBHOOK_URLS": "https://h.example.com:xx/s3cr3t"},
            "RASTRO_ALERT_WEBHOOK_URLS",
            ("s3cr3t",),
        ),
        (
            {"RASTRO_ALERT_WEBHOOK_URLS": "https://[::1/s3cr3t"},
            "RASTRO_ALERT_WEBHOOK_URLS",
            ("s3cr3t",),
        ),
        (
            {
                "RASTRO_ALERT_SMTP_URL": "https://bot:hunter2@smtp.example.com",
                "RASTRO_ALERT_EMAIL_TO": "a@x.com",
            },
            "RASTRO_ALERT_SMTP_URL",
            ("hunter2",),
        ),
        (
            {"RASTRO_ALERT_SMTP_URL": "smtp://bot:hunter2@", "RASTRO_ALERT_EMAIL_TO": "a@x.com"},
            "RASTRO_ALERT_SMTP_URL",
            ("hunter2",),
        ),
        (
            # An unencoded '/' in the password ends the host early.
            {
                "RASTRO_ALERT_SMTP_URL": "smtp://bot:hun/ter2@smtp.example.com",
                "RASTRO_ALERT_EMAIL_TO": "a@x.com",
            },
            "RASTRO_ALERT_SMTP_URL",
            ("hun", "ter2"),
        ),
        ({"RASTRO_ALERT_SMTP_URL": SMTP_SECRET}, "RASTRO_ALERT_EMAIL_TO", ("hunter2",)),
        (
            {"RASTRO_ALERT_SMTP_URL": SMTP_SECRET, "RASTRO_ALERT_EMAIL_TO": " , "},
            "RASTRO_ALERT_EMAIL_TO",
            ("hunter2",),
        ),
        ({"RASTRO_ALERT_EMAIL_TO": "a@x.com"}, "RASTRO_ALERT_SMTP_URL", ()),
        (
            {"RASTRO_ALERT_SMTP_URL": SMTP_SECRET, "RASTRO_ALERT_EMAIL_TO": "a@x.com, hunter2"},
            "RASTRO_ALERT_EMAIL_TO",
            ("hunter2",),
        ),
        (
            {
                "RASTRO_ALERT_SMTP_URL": SMTP_SECRET,
                "RASTRO_ALERT_EMAIL_TO": "a@x.com",
                "RASTRO_ALERT_EMAIL_FROM": "hunter2",
            },
            "RASTRO_ALERT_EMAIL_FROM",
            ("hunter2",),
        ),
    ],
)
def test_a_malformed_setting_names_its_variable_never_the_secret(
    env: dict[str, str], variable: str, secrets: tuple[str, ...]
):
    with pytest.raises(SettingsError) as caught:
        channels_from_env(env)
    shown = str(caught.value)
    assert variable in shown
    assert "\n" not in shown
    for secret in secrets:
        assert secret not in shown
    for value in env.values():
        assert value.strip() not in shown
