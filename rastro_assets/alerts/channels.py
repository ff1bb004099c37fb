"""Where an incident's messages go: incoming webhooks and email, as the environment says.

`RASTRO_ALERT_WEBHOOK_URLS` (comma-separated) receives each message as a JSON POST with a
`text` field, the one field Slack and Teams incoming webhooks both read, escaped as Slack
asks (`alerts.quoted`): the data a message quotes is in inline code spans already.
`RASTRO_ALERT_SMTP_URL` (`smtp://user:password@host:port`, STARTTLS when offered, or
`smtps://` for TLS from the start) with `RASTRO_ALERT_EMAIL_TO` (comma-separated) sends the
same messages by email, from `RASTRO_ALERT_EMAIL_FROM` when set.

Plain httpx and the standard library's smtplib: dagster-slack needs a Slack bot token and
reaches Slack only, dagster-msteams reaches Teams only, and apprise is large, posts no `text`
field to a generic JSON webhook and has URL schemes of its own instead of the plain URLs the
contract names.

Webhook URLs carry their secret in the path and SMTP URLs a password, so neither is ever put
in an error, a log line or a `repr`: a channel is known by its `label` (host, position,
recipients) and its `channel_id` (a hash), and a `DeliveryError` says only the channel's label
and the kind of failure, never an underlying exception's text, which may quote the URL.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import smtplib
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Protocol
from urllib.parse import SplitResult, unquote, urlsplit

import httpx

from rastro_assets.alerts.quoted import for_webhook
from rastro_assets.settings import (
    RASTRO_ALERT_EMAIL_FROM,
    RASTRO_ALERT_EMAIL_TO,
    RASTRO_ALERT_SMTP_URL,
    RASTRO_ALERT_WEBHOOK_URLS,
    SettingsError,
)

WEBHOOK_URLS_VAR = RASTRO_ALERT_WEBHOOK_URLS.name
SMTP_URL_VAR = RASTRO_ALERT_SMTP_URL.name
EMAIL_TO_VAR = RASTRO_ALERT_EMAIL_TO.name
EMAIL_FROM_VAR = RASTRO_ALERT_EMAIL_FROM.name

DEFAULT_TIMEOUT_SECONDS = 10.0
SMTP_PORT = 587
SMTPS_PORT = 465


@dataclass(frozen=True)
class Message:
    """One message about one incident, the same for every channel."""

    incident_key: str
    event: str
    subject: str
    text: str


class DeliveryError(Exception):
    """A channel could not deliver. str(error) is safe to log and show: it names the channel by
    its label and the cause (an HTTP status, 'connection refused', 'timed out', an SMTP reply
    code and class), never a URL path, query, user name or password."""


class Channel(Protocol):
    channel_id: str
    label: str

    def send(self, message: Message) -> None: ...


class _WhileSending(logging.Filter):
    """Drops httpx's records on a thread while it posts to a webhook: httpx logs each
    request's full URL at INFO, and a webhook's URL path is its secret. Other threads'
    requests (Meta's) keep their lines."""

    def __init__(self) -> None:
        super().__init__()
        self.sending = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.sending, "on", False)


_SENDING = _WhileSending()
logging.getLogger("httpx").addFilter(_SENDING)


@contextmanager
def _quiet_httpx() -> Iterator[None]:
    _SENDING.sending.on = True
    try:
        yield
    finally:
        _SENDING.sending.on = False


class WebhookChannel:
    """An incoming webhook (Slack, Teams, or anything that takes a JSON POST)."""

    def __init__(self, url: str, *, position: int = 1, timeout: float = DEFAULT_TIMEOUT_SECONDS):
        parts = _webhook_parts(url, position)
        self._url = url
        self._timeout = timeout
        self.channel_id = "webhook:" + _digest(url)
        self.label = f"webhook {position} ({parts.hostname})"

    def __repr__(self) -> str:
        return self.label

    def send(self, message: Message) -> None:
        # Slack and Teams ignore fields they do not know; a generic receiver may route on these.
        # Every text is escaped: a receiver may show any of them as Slack markup.
        payload = {
            "text": for_webhook(message.text),
            "rastro_event": message.event,
            "rastro_incident": for_webhook(message.incident_key),
            "rastro_subject": for_webhook(message.subject),
        }
        try:
            with _quiet_httpx(), httpx.Client(
                timeout=self._timeout, follow_redirects=False
            ) as client:
                response = client.post(self._url, json=payload)
        # An httpx message may quote the URL, whose path is the webhook's secret: only the kind
        # of failure is told, and `from None` keeps the original out of tracebacks too.
        except httpx.TimeoutException:
            raise DeliveryError(f"{self.label}: timed out") from None
        except httpx.ConnectError:
            raise DeliveryError(f"{self.label}: connection refused or unreachable") from None
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
            raise DeliveryError(f"{self.label}: {type(exc).__name__}") from None
        if not response.is_success:
            raise DeliveryError(f"{self.label}: HTTP {response.status_code}")


class EmailChannel:
    """Email through one SMTP server to a fixed list of recipients."""

    def __init__(
        self,
        smtp_url: str,
        recipients: Sequence[str],
        *,
        sender: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ):
        smtp_url = smtp_url.strip()
        parts = _smtp_parts(smtp_url)
        if not recipients:
            raise SettingsError(f"{EMAIL_TO_VAR} names no recipient")
        for position, recipient in enumerate(recipients, start=1):
            _check_address(recipient, f"{EMAIL_TO_VAR}: recipient {position}")
        self._implicit_tls = parts.scheme == "smtps"
        self._host = parts.hostname or ""
        self._port = parts.port or (SMTPS_PORT if self._implicit_tls else SMTP_PORT)
        self._user = None if parts.username is None else unquote(parts.username)
        self._password = unquote(parts.password or "")
        self._recipients = tuple(recipients)
        if sender is None:
            sender = self._user if self._user and "@" in self._user else None
        self._sender = sender or f"rastro@{socket.getfqdn()}"
        self._timeout = timeout
        self.channel_id = "email:" + _digest(smtp_url + "|" + ",".join(self._recipients))
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.label = f"email to {', '.join(self._recipients)} via {host}:{self._port}"

    def __repr__(self) -> str:
        return self.label

    def send(self, message: Message) -> None:
        email = EmailMessage()
        # A line break in a header would make EmailMessage refuse the whole message.
        email["Subject"] = " ".join(message.subject.splitlines())
        email["From"] = self._sender
        email["To"] = ", ".join(self._recipients)
        email.set_content(message.text)
        try:
            self._deliver(email)
        except DeliveryError:
            raise
        # smtplib's and ssl's messages can echo what the server was sent, credentials included:
        # only the class and the reply code are told, and `from None` drops the original.
        except (OSError, ValueError) as exc:
            raise DeliveryError(f"{self.label}: {_smtp_cause(exc)}") from None

    def _deliver(self, email: EmailMessage) -> None:
        context = ssl.create_default_context()
        smtp: smtplib.SMTP
        if self._implicit_tls:
            smtp = smtplib.SMTP_SSL(self._host, self._port, context=context, timeout=self._timeout)
        else:
            smtp = smtplib.SMTP(self._host, self._port, timeout=self._timeout)
        try:
            smtp.ehlo_or_helo_if_needed()
            if not self._implicit_tls:
                if smtp.has_extn("starttls"):
                    smtp.starttls(context=context)
                    smtp.ehlo()
                elif self._user is not None and not _is_loopback(self._host):
                    raise DeliveryError(
                        f"{self.label}: the server offers no STARTTLS, so the password is not"
                        " sent in clear (use smtps:// if the server speaks TLS from the start)"
                    )
            if self._user is not None:
                smtp.login(self._user, self._password)
            smtp.send_message(email, from_addr=self._sender, to_addrs=list(self._recipients))
            # The server has taken the message: a failed goodbye must not make it look undelivered.
            with suppress(OSError):
                smtp.quit()
        finally:
            smtp.close()


def channels_from_env(
    environ: Mapping[str, str] | None = None, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[Channel]:
    """Every configured channel, webhooks first in the order given. Raises
    rastro_assets.settings.SettingsError (import it; it is a ValueError subclass) with one line
    naming the variable and what is wrong (a URL that is not http(s), an SMTP URL without a host,
    RASTRO_ALERT_SMTP_URL set without RASTRO_ALERT_EMAIL_TO or the reverse, a recipient without @)
    but NEVER echoing the secret value itself (no URL, no password in the message)."""
    channels: list[Channel] = [
        WebhookChannel(url, position=position, timeout=timeout)
        for position, url in enumerate(_items(RASTRO_ALERT_WEBHOOK_URLS.read(environ)), start=1)
    ]
    smtp_url = RASTRO_ALERT_SMTP_URL.read(environ) or ""
    recipients = _items(RASTRO_ALERT_EMAIL_TO.read(environ))
    if smtp_url and not recipients:
        raise SettingsError(f"{SMTP_URL_VAR} is set but {EMAIL_TO_VAR} names no recipient")
    if recipients and not smtp_url:
        raise SettingsError(f"{EMAIL_TO_VAR} is set but {SMTP_URL_VAR} is not")
    if smtp_url:
        sender = RASTRO_ALERT_EMAIL_FROM.read(environ)
        if sender is not None:
            _check_address(sender, EMAIL_FROM_VAR)
        channels.append(EmailChannel(smtp_url, recipients, sender=sender, timeout=timeout))
    return channels


def _items(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _split(url: str) -> SplitResult | None:
    """The URL's parts, or None when its host or port cannot be read."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # reading it is what checks the port: urlsplit alone does not
    except ValueError:
        return None
    return parts if parts.hostname else None


def _webhook_parts(url: str, position: int) -> SplitResult:
    parts = _split(url)
    if parts is None or parts.scheme not in ("http", "https"):
        raise SettingsError(
            f"{WEBHOOK_URLS_VAR}: URL {position} is not an http(s) URL with a host"
            " (the URL itself is not shown: it is a secret)"
        )
    return parts


def _smtp_parts(url: str) -> SplitResult:
    scheme, separator, _ = url.partition("://")
    if not separator or scheme.lower() not in ("smtp", "smtps"):
        raise SettingsError(
            f"{SMTP_URL_VAR} must start with smtp:// or smtps:// (its value is not shown: it"
            " holds a password)"
        )
    parts = _split(url)
    if parts is None:
        raise SettingsError(
            f"{SMTP_URL_VAR} has no host or a port that is not a number (percent-encode any"
            " '/', '?', '#' or '@' in the user name and password; the value is not shown)"
        )
    return parts


def _check_address(address: str, what: str) -> None:
    # The value is not quoted: a misplaced secret (a URL pasted into the wrong variable) would
    # otherwise reach the log.
    local, _, domain = address.rpartition("@")
    if not local or not domain or any(char.isspace() for char in address):
        raise SettingsError(f"{what} is not an email address (user@domain)")


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _smtp_cause(exc: BaseException) -> str:
    name = type(exc).__name__
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"{name} {exc.smtp_code}"
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = sorted({str(reply[0]) for reply in exc.recipients.values()})
        return f"{name} {', '.join(codes)}".rstrip()
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"{name} ({exc.verify_message})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return f"connection refused or unreachable ({name})"
    return name
