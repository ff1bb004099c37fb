"""Real alert receivers on loopback, for tests that check what reaches an operator.

- `webhook_receiver()`: an HTTP server that records each JSON POST and answers `status`,
  which a test may change at any time (503 for a receiver that is down).
- `smtp_receiver()`: an aiosmtpd server, optionally with a login, that records each email.
- `closed_port()`: a loopback port nobody listens on.

Both receivers are context managers that run their server on a thread of this process, so
they serve a daemon started as a subprocess as well as a sensor evaluated in-process. Each
has `wait_for(count, timeout)` for tests that run on the wall clock (a real daemon); tests on
a pinned clock read `bodies` / `messages` directly, as delivery is synchronous there.

    with webhook_receiver() as hook, smtp_receiver(user=USER, password=PASSWORD) as smtp:
        monkeypatch.setenv("RASTRO_ALERT_WEBHOOK_URLS", hook.url)
        monkeypatch.setenv("RASTRO_ALERT_SMTP_URL", smtp.url())
        monkeypatch.setenv("RASTRO_ALERT_EMAIL_TO", "ops@rastro.test")
        ...
        assert [body["rastro_event"] for body in hook.bodies] == ["opened"]
        assert "rastro connect c1" in smtp.messages[0].text

The webhook's URL ends in `WEBHOOK_SECRET_PATH` and the SMTP login uses `SMTP_PASSWORD` by
default: distinctive strings a test can search files and logs for, as neither may ever leak.
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

WEBHOOK_SECRET_PATH = "/services/T0RASTRO/B0RASTRO/wh-s3cr3t-9f2c71"
SMTP_USER = "alerts@rastro.test"
SMTP_PASSWORD = "smtp-s3cr3t/p@ss 71"
"""Has '/', '@' and a space, so it is percent-encoded in the URL: a leak of either form is a
leak (`SMTP_PASSWORD_IN_URL`)."""
SMTP_PASSWORD_IN_URL = quote(SMTP_PASSWORD, safe="")


def closed_port() -> int:
    """A loopback port that was free a moment ago: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(condition: threading.Condition, ready: Callable[[], bool], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    with condition:
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            condition.wait(left)


# --- webhooks ---------------------------------------------------------------------------------


@dataclass
class WebhookReceiver:
    """What one loopback webhook got. `status` is what it answers the next POST."""

    url: str = ""
    status: int = 200
    bodies: list[dict[str, Any]] = field(default_factory=list)
    """The JSON bodies it answered with a 2xx status, in order."""
    refused: list[dict[str, Any]] = field(default_factory=list)
    """The JSON bodies it answered with any other status (the sender must try them again)."""
    content_types: list[str] = field(default_factory=list)
    """The Content-Type of every POST it recorded, accepted or refused, in order."""
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)

    @property
    def texts(self) -> list[str]:
        return [body.get("text", "") for body in self.bodies]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The accepted bodies once there are at least `count` (raises after `timeout` s)."""
        _wait(self._changed, lambda: len(self.bodies) >= count, timeout,
              f"{count} webhook posts (got {len(self.bodies)})")
        return list(self.bodies)

    def _record(self, body: dict[str, Any], content_type: str) -> int:
        with self._changed:
            status = self.status
            self.content_types.append(content_type)
            (self.bodies if 200 <= status < 300 else self.refused).append(body)
            self._changed.notify_all()
        return status


@contextmanager
def webhook_receiver(
    path: str = WEBHOOK_SECRET_PATH, status: int = 200
) -> Iterator[WebhookReceiver]:
    """An HTTP server on 127.0.0.1 (a port the system picks) whose `url` ends in `path`.
    A POST to any other path is answered 404 and not recorded."""
    receiver = WebhookReceiver(status=status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            content_type = self.headers.get("Content-Type", "")
            answer = receiver._record(json.loads(raw), content_type) if self.path == path else 404
            self.send_response(answer)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the request line holds the secret path: kept out of stderr

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- email ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mail:
    """One email as the SMTP server took it."""

    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    authenticated: bool
    tls: bool

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.raw, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def text(self) -> str:
        """The body, decoded (the sender may use quoted-printable for long lines)."""
        return self.message.get_content().replace("\r\n", "\n")


class _Collector:
    def __init__(self, receiver: SmtpReceiver) -> None:
        self._receiver = receiver

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        mail = Mail(
            mail_from=envelope.mail_from,
            rcpt_tos=list(envelope.rcpt_tos),
            raw=envelope.original_content,
            authenticated=bool(session.authenticated),
            tls=server.transport.get_extra_info("ssl_object") is not None,
        )
        with self._receiver._changed:
            self._receiver.messages.append(mail)
            self._receiver._changed.notify_all()
        return "250 OK"


class LoopbackController(Controller):
    """aiosmtpd's controller on a port the system picks (it would ping port 0 otherwise)."""

    def _trigger_server(self) -> None:
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


@dataclass
class SmtpReceiver:
    """What one loopback SMTP server got."""

    host: str
    port: int = 0
    user: str | None = None
    password: str | None = None
    messages: list[Mail] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def url(self, scheme: str = "smtp", *, password: str | None = None) -> str:
        """The `RASTRO_ALERT_SMTP_URL` reaching this server, with its login when it has one;
        `password` puts another one in that login (one the server refuses)."""
        login = ""
        if self.user is not None:
            password = self.password if password is None else password
            login = f"{quote(self.user, safe='')}:{quote(password or '', safe='')}@"
        return f"{scheme}://{login}{self.host}:{self.port}"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Mail]:
        """The emails once there are at least `count` (raises after `timeout` s)."""
        _wait(self._changed, lambda: len(self.messages) >= count, timeout,
              f"{count} emails (got {len(self.messages)})")
        return list(self.messages)


@contextmanager
def smtp_receiver(
    *, user: str | None = None, password: str | None = None, host: str = "127.0.0.1",
    **controller: Any,
) -> Iterator[SmtpReceiver]:
    """An aiosmtpd server on `host`. With `user` and `password` it refuses mail until that
    login (AUTH PLAIN or LOGIN) succeeds, and accepts the login without TLS, as the product
    sends a password in clear only to a loopback server. Other keyword arguments go to
    aiosmtpd's `Controller` (`tls_context=` for STARTTLS, `ssl_context=` for smtps)."""
    receiver = SmtpReceiver(host=host, user=user, password=password)
    if user is not None:
        def authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
            good = isinstance(auth_data, LoginPassword) and auth_data == (
                user.encode(), (password or "").encode()
            )
            return AuthResult(success=good, handled=False)

        controller.setdefault("authenticator", authenticate)
        controller.setdefault("auth_required", True)
        controller.setdefault("auth_require_tls", False)
    server = LoopbackController(_Collector(receiver), hostname=host, port=0, **controller)
    server.start()
    receiver.port = server.port
    try:
        yield receiver
    finally:
        server.stop()
