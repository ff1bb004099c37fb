"""The fake Graph over real sockets, on loopback only.

The same `handle()` as the in-process transport answers; this module only
carries bytes. Faults become what a client would see from a real network: a
"timeout" stalls without answering, "dropped" sends half a body and closes. The world's
`request_delay_seconds` holds every answer back that long, as Meta's latency would.

A server given a `control_key` also answers `CONTROL_PATH`, where trouble is staged and taken
away (`rastro_fake_graph.trouble`): `GET` lists what is staged, `POST` a JSON body
`{"stage": KIND, "account": ...}` or `{"mend": KIND | "all", "account": ...}` changes it
(the answer: what it `changed`, and all that is `staged` now).
Only a request whose `CONTROL_HEADER` carries the key is answered (compared in constant time):
the fake binds loopback, and the key keeps other local users from staging trouble in someone
else's demo.

`add_limit_options` and `limit_model` give a server's command line the choice of Meta's rate
limits (`rastro_fake_graph.limits`); `python -m rastro_fake_graph` serves the demo world
under the limits its options choose.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rastro_fake_graph.app import SERVER_CDN_PREFIX, dribble, handle, huge_body
from rastro_fake_graph.limits import (
    DEFAULT_ACCOUNT_INSIGHTS_LOAD,
    DEFAULT_APP_INSIGHTS_LOAD,
    DEFAULT_DAILY_ACTIVE_USERS,
    LIMIT_NAMES,
    TIERS,
    LimitModel,
)
from rastro_fake_graph.trouble import TroubleDesk
from rastro_fake_graph.world import GRAPH_VERSION, FakeWorld

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
# How often serve_forever looks for a shutdown request: keeps close() quick.
SHUTDOWN_POLL_SECONDS = 0.05
CONTROL_PATH = "/_rastro/trouble"
CONTROL_HEADER = "X-Rastro-Control"
CONTROL_BODY_MAX_BYTES = 4096


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Buffer each answer into one send: headers and body written apart meet
    # Nagle and delayed ACKs, costing ~40 ms a request.
    wbufsize = 1 << 16
    server: _FakeHTTPServer

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.path.split("?", 1)[0] == CONTROL_PATH:
            self._control(length)
            return
        body = self.rfile.read(length) if length else b""
        origin = self.server.origin
        answer = handle(
            self.server.world,
            self.command,
            origin + self.path,
            dict(self.headers.items()),
            body,
            cdn_base=origin + SERVER_CDN_PREFIX,
        )
        delay = self.server.world.request_delay_seconds
        if delay > 0:
            # Outside the world's lock: requests in flight wait side by side, as at Meta.
            self.server.world.sleep(delay)
        if answer.fault == "timeout":
            time.sleep(self.server.world.server_stall_seconds)
            self._hang_up()
            return
        if answer.fault == "huge":
            self._send_without_length(answer.status, answer.headers,
                                      huge_body(self.server.world.huge_body_bytes))
            return
        self.send_response(answer.status)
        for name, value in answer.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        if answer.fault == "dropped":
            self.wfile.write(answer.body[: len(answer.body) // 2])
            self.wfile.flush()
            self._hang_up()
            return
        if answer.fault == "slow":
            self._send_each(dribble(answer.body, self.server.world))
            return
        self.wfile.write(answer.body)

    def _control(self, length: int) -> None:
        """Trouble staged, taken away or listed, for the holder of the server's key only."""
        key = self.server.control_key
        if key is None:
            self._answer_json(404, {"error": "no trouble is staged here"})
            return
        given = self.headers.get(CONTROL_HEADER) or ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            self._answer_json(403, {"error": f"{CONTROL_HEADER} is missing or wrong"})
            return
        if length > CONTROL_BODY_MAX_BYTES:
            self._answer_json(413, {"error": "the request is too long"})
            return
        body = self.rfile.read(length) if length else b""
        desk = self.server.trouble
        if self.command == "GET":
            self._answer_json(200, {"staged": [each.to_json() for each in desk.staged()]})
            return
        if self.command != "POST":
            self._answer_json(405, {"error": "GET or POST"})
            return
        try:
            asked = json.loads(body or b"{}")
            if not isinstance(asked, dict):
                raise ValueError("the body must be a JSON object")
            account = asked.get("account")
            if account is not None and not isinstance(account, str):
                raise ValueError("account must be a string")
            if "stage" in asked:
                done = [desk.stage(str(asked["stage"]), account)]
            elif "mend" in asked:
                kind = str(asked["mend"])
                done = desk.mend(None if kind == "all" else kind, account)
            else:
                raise ValueError('the body names neither "stage" nor "mend"')
        except ValueError as exc:
            self._answer_json(400, {"error": str(exc)})
            return
        self._answer_json(200, {
            "changed": [each.to_json() for each in done],
            "staged": [each.to_json() for each in desk.staged()],
        })

    def _answer_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        # A refused request's body is left unread: the connection serves nothing more.
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _send_without_length(
        self, status: int, headers: list[tuple[str, str]], chunks: Iterator[bytes]
    ) -> None:
        """A body that only the connection's close ends, as HTTP/1.0 allowed."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self._send_each(chunks)
        self._hang_up()

    def _send_each(self, chunks: Iterator[bytes]) -> None:
        # A client that stops reading hangs up: that ends the answer, quietly.
        with contextlib.suppress(OSError):
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: object) -> None:
        # Paths carry signed CDN queries; keep them out of default output.
        log.debug("fake graph: %s", format % args)


class _FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(
        self, world: FakeWorld, host: str, port: int, control_key: str | None = None
    ) -> None:
        self.world = world
        self.control_key = control_key
        self.trouble = TroubleDesk(world)
        super().__init__((host, port), _Handler)
        bound_host, bound_port = self.server_address[:2]
        self.origin = f"http://{bound_host}:{bound_port}"


class FakeGraphServer:
    """A running fake Graph; use as a context manager or call `close()`.

    `control_key`: the key that stages trouble through `CONTROL_PATH`; None: no such route.
    """

    def __init__(
        self, world: FakeWorld, host: str = "127.0.0.1", port: int = 0,
        control_key: str | None = None,
    ) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the fake Graph binds loopback only, not {host}")
        if control_key is not None and len(control_key) < 16:
            raise ValueError("a control key must be at least 16 characters")
        self.world = world
        self._httpd = _FakeHTTPServer(world, host, port, control_key)
        self.trouble = self._httpd.trouble
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name="fake-graph", daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def origin(self) -> str:
        return self._httpd.origin

    @property
    def base_url(self) -> str:
        """The Graph base a client is given, version included."""
        return f"{self.origin}/{GRAPH_VERSION}"

    @property
    def control_url(self) -> str:
        """Where trouble is staged (answered only with a `control_key`)."""
        return f"{self.origin}{CONTROL_PATH}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeGraphServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve(
    world: FakeWorld, host: str = "127.0.0.1", port: int = 0, control_key: str | None = None
) -> FakeGraphServer:
    """Start serving `world` on loopback (port 0: any free port); with `control_key`, trouble
    can be staged in it through `CONTROL_PATH`."""
    return FakeGraphServer(world, host, port, control_key)


def run_server(port: int = DEFAULT_PORT, world: FakeWorld | None = None,
               host: str = "127.0.0.1", limits: LimitModel | None = None) -> None:
    """Serve `world` (the demo world by default) until interrupted; `limits` replaces the
    world's rate-limit model."""
    world = world or FakeWorld.demo()
    if limits is not None:
        world.limits = limits
    with serve(world, host, port) as server:
        print(f"fake Meta Graph at {server.base_url} (Ctrl-C to stop)", flush=True)
        if limits is not None:
            print(f"rate limits: {limits.describe()}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """The options choosing the fake's rate limits; `limit_model(args)` reads them."""
    group = parser.add_argument_group("Meta's rate limits")
    group.add_argument("--tier", choices=TIERS, default="standard",
                       help="access tier: standard (Full) or development (Limited)")
    group.add_argument("--app-insights-load", type=float, default=DEFAULT_APP_INSIGHTS_LOAD,
                       metavar="UNITS", help="the app's insights load units a second, every "
                       f"token together (default {DEFAULT_APP_INSIGHTS_LOAD:,.0f})")
    group.add_argument("--account-insights-load", type=float,
                       default=DEFAULT_ACCOUNT_INSIGHTS_LOAD, metavar="UNITS",
                       help="one account's insights load units a second "
                       f"(default {DEFAULT_ACCOUNT_INSIGHTS_LOAD:,.0f})")
    group.add_argument("--daily-active-users", type=int, default=DEFAULT_DAILY_ACTIVE_USERS,
                       metavar="N", help="the app's users: 200 platform calls an hour each "
                       f"(default {DEFAULT_DAILY_ACTIVE_USERS:,})")
    group.add_argument("--limit-off", action="append", choices=LIMIT_NAMES, default=[],
                       metavar="LIMIT", help="a limit not to enforce (repeatable): "
                       + ", ".join(LIMIT_NAMES))


def limit_model(args: argparse.Namespace) -> LimitModel:
    """The model `add_limit_options`' options chose; ValueError for an impossible one."""
    return LimitModel(
        tier=args.tier, app_insights_load=args.app_insights_load,
        account_insights_load=args.account_insights_load,
        daily_active_users=args.daily_active_users, off=frozenset(args.limit_off),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rastro_fake_graph",
        description="serve the fake Meta Graph (the demo accounts) on loopback until Ctrl-C")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    add_limit_options(parser)
    args = parser.parse_args(argv)
    try:
        limits = limit_model(args)
    except ValueError as exc:
        parser.error(str(exc))
    run_server(args.port, host=args.host, limits=limits)
