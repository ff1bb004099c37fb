"""The HTTP session with the Graph: requests, retries with back-off, decoding, paging.

The token travels only in the `Authorization` header, so no URL, message,
repr or log line built here can contain it; Meta's own error messages are
scrubbed too, in case Meta ever echoes it. httpx exceptions are converted to
`MetaError` without their text or chain (`without_httpx_errors`).

Every answer is bounded (`ReadBounds`): its body is streamed and dropped past a byte cap,
and a paged read may be given a most of pages and a total time, retries and slow bodies
included. Going past any is an `OutOfBounds` error, never retried.

Every Graph request is paced by the process's `pacing.Pacer`: it takes a place among the
requests in flight, waits out the app's pause and its account's short hold, and a throttle
the pacer can wait out is waited out and the request sent again. A hold too long to wait in
the run is raised as the throttle (the sync ends throttled); one an answer announced (the
account's own usage near its cap) also refuses the account's later requests of this session
until it ends.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import random
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any, Protocol, TypeVar
from urllib.parse import urlencode

import httpx

from rastro_assets.meta.bounds import (
    ANY_ANSWER,
    GRAPH_BODY_MAX_BYTES,
    Deadline,
    Limits,
    ReadBounds,
    too_big,
)
from rastro_assets.meta.errors import (
    ErrorKind,
    MalformedResponse,
    MetaError,
    TimedOut,
    classify_error,
)
from rastro_assets.meta.limits import describe
from rastro_assets.meta.models import CallStats, Usage
from rastro_assets.meta.pacing import (
    ACCOUNT_WAIT_IN_RUN_SECONDS,
    IN_RUN_WAIT_MAX_SECONDS,
    Attempt,
    Hold,
    HoldAhead,
    Pacer,
    default_pacer,
)
from rastro_assets.meta.usage import app_readings_of, decode_usage_headers, usage_of

log = logging.getLogger(__name__)

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 60.0
# One answer, however slowly its bytes come, has this many request timeouts to arrive whole.
ANSWER_TIMEOUTS = 2

T = TypeVar("T")


class DecodedPage(Protocol):
    """A page a `PageReader` read straight from its bytes: its data and its paging."""

    @property
    def data(self) -> Any: ...

    next_url: str | None  # `paging.next`
    after: str | None  # `paging.cursors.after`


# Reads an HTTP 200 body straight into a page; None: decode it with `json` as usual.
PageReader = Callable[[bytes], DecodedPage | None]


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every client of the process.

    Building one loads and parses the CA bundle; a wave builds a client per
    account sync, hundreds per run.
    """
    return httpx.create_ssl_context()


class _Secret:
    """Holds the token so that no repr, `vars()` dump or f-string shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def check_token_text(token: str) -> None:
    """ValueError unless `token` is one line of printable ASCII without surrounding whitespace."""
    if not isinstance(token, str) or not token.strip() or token != token.strip():
        raise ValueError("the Meta access token is empty or has surrounding whitespace")
    if any(ch in token for ch in "\r\n\0"):
        raise ValueError("the Meta access token is not a single line")
    # httpx would refuse it in the header with an error naming the character.
    if not token.isascii() or not token.isprintable():
        raise ValueError("the Meta access token has characters outside printable ASCII")


def without_httpx_errors(attempt: Callable[[], T], *, timed_out: str, failed: str) -> T:
    """`attempt()`, with an httpx timeout as `TimedOut(timed_out)` and any other
    httpx failure as a TRANSIENT `MetaError` (`failed`, plus the exception's class name).

    Raised outside the `except` so the httpx exception (which holds the request,
    Authorization header included) is not even its __context__.
    """
    failure: MetaError
    try:
        return attempt()
    except httpx.TimeoutException:
        failure = TimedOut(ErrorKind.TRANSIENT, timed_out)
    except httpx.HTTPError as exc:
        failure = MetaError(ErrorKind.TRANSIENT, f"{failed} ({type(exc).__name__})")
    raise failure


class GraphSession:
    """One httpx client with its token, retries and what it spent (`stats`)."""

    def __init__(
        self, token: str, *, base_url: str, transport: httpx.BaseTransport | None,
        timeout_seconds: float, max_retries: int, sleep: Callable[[float], None],
        monotonic: Callable[[], float] = time.monotonic, pacer: Pacer | None = None,
    ) -> None:
        """Built by `MetaClient`, which checks the token's text and defaults the rest.

        `pacer`: None paces with the process's own (`pacing.default_pacer()`).
        """
        self._token = _Secret(token)
        # The pacer counts a token's requests in flight by this, never by the token itself.
        self._token_key = hashlib.blake2b(token.encode(), digest_size=8).hexdigest()
        self._pacer = pacer
        # Accounts whose hold is too long to wait in the run: (its hold, when it ends).
        self._long_holds: dict[str, tuple[Hold, float]] = {}
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._max_retries = max_retries
        self.sleep = sleep
        self.monotonic = monotonic
        self._random = random.Random()
        self.http = httpx.Client(
            transport=transport,
            verify=_shared_ssl_context(),
            timeout=httpx.Timeout(timeout_seconds),
            follow_redirects=False,
            headers={"User-Agent": "rastro-assets"},
        )
        self.stats = CallStats()
        # The ranges of one insights read share this session from a few threads.
        self._stats_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GraphSession(base_url={self.base_url!r})"

    @property
    def pacer(self) -> Pacer:
        # Looked up on each use, so a session made before a fork paces with the child's own.
        return self._pacer if self._pacer is not None else default_pacer()

    def close(self) -> None:
        self.http.close()

    def scrub(self, text: str) -> str:
        """`text` without the token, in case Meta echoes it."""
        return text.replace(self._token.value, "[token]")

    # -- paging ---------------------------------------------------------------

    def pages(
        self,
        path: str,
        params: Mapping[str, str],
        *,
        what: str,
        retry_timeouts: bool = True,
        read_page: PageReader | None = None,
        bounds: ReadBounds = ANY_ANSWER,
        account: str | None = None,
    ) -> Iterator[Any]:
        """Each page's `data`, following `after` cursors while `next` is given.

        `account`: the ad account the read is for (None: a platform call), which holds it.

        With `read_page`, a page it reads comes as its `data` (the insights reader's
        is a table); any other as the `data` list `json` decoded. `OutOfBounds` when a page
        past `bounds.max_pages` is announced, or the read outlasts `bounds.seconds`.
        """
        after: str | None = None
        next_url: str | None = None
        seen: set[str] = set()
        deadline = bounds.deadline(self.monotonic())
        read = 0
        # The URL httpx would build from `params` (and `after`), encoded once: httpx
        # re-checks every character of a merged query in Python, on every page.
        first_url = f"{self._url(path)}?{urlencode(params)}" if params else self._url(path)
        while True:
            if next_url is not None:
                url = next_url
            elif after:
                url = f"{first_url}{'&' if params else '?'}{urlencode({'after': after})}"
            else:
                url = first_url
            bounds.check_page(read, what)
            body = self.call("GET", url, what=what, retry_timeouts=retry_timeouts,
                             read_page=read_page, max_body_bytes=bounds.max_body_bytes,
                             deadline=deadline, account=account)
            read += 1
            if not isinstance(body, dict):
                yield body.data
                next_link, cursor = body.next_url, body.after
            else:
                data = body.get("data")
                if not isinstance(data, list):
                    raise MalformedResponse(f"Meta answered {what} without a 'data' list")
                yield data
                paging = body.get("paging")
                paging = paging if isinstance(paging, Mapping) else {}
                next_link = paging.get("next")
                cursors = paging.get("cursors")
                cursor = cursors.get("after") if isinstance(cursors, Mapping) else None
            if not next_link:
                return
            if isinstance(cursor, str) and cursor:
                after, next_url = cursor, None
                marker = cursor
            else:
                next_url = self._same_origin_next(next_link, what)
                marker = next_url
            if marker in seen:
                raise MalformedResponse(f"Meta repeated a paging cursor during {what}")
            seen.add(marker)

    def _same_origin_next(self, next_url: Any, what: str) -> str:
        """`paging.next` without any `access_token`, if it points at our Graph base."""
        try:
            url = httpx.URL(str(next_url))
        except httpx.InvalidURL:
            raise MalformedResponse(f"Meta gave an unreadable 'next' URL during {what}") from None
        base = httpx.URL(self.base_url)
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
            raise MalformedResponse(
                f"Meta's 'next' URL during {what} leaves {base.host}; not following it"
            )
        return str(url.copy_remove_param("access_token"))

    def _url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
        return f"{self.base_url}/{path_or_url}"

    # -- requests and retries ---------------------------------------------------

    def call(
        self,
        method: str,
        path_or_url: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        data: Mapping[str, str] | None = None,
        retry_timeouts: bool = True,
        read_page: PageReader | None = None,
        max_body_bytes: int = GRAPH_BODY_MAX_BYTES,
        deadline: Deadline | None = None,
        account: str | None = None,
    ) -> Any:
        """The decoded body: a dict, or what `read_page` made of it; `OutOfBounds` past
        `max_body_bytes`, or past `deadline` (a paged read's).

        `account`: the ad account the request is for (None: a platform call). Its own
        limit holds only its requests; the app's holds every request.
        """
        url = self._url(path_or_url)
        limits = Limits(max_body_bytes, deadline)
        return self._paced(
            what,
            account,
            deadline,
            lambda attempt: self.retrying(
                what,
                lambda: self._once(method, url, params, data, what, read_page, limits,
                                   account, attempt),
                retry_timeouts=retry_timeouts,
                deadline=deadline,
            ),
        )

    # -- pacing -----------------------------------------------------------------

    def _paced(
        self,
        what: str,
        account: str | None,
        deadline: Deadline | None,
        send: Callable[[Attempt], T],
    ) -> T:
        """`send(attempt)`, after the holds ahead of it, and again after a throttle the
        pacer waits out; each wait is bounded (`ACCOUNT_WAIT_IN_RUN_SECONDS` for the
        account's own limit, `IN_RUN_WAIT_MAX_SECONDS` for the app's, and `deadline`)."""
        pacer = self.pacer
        waited = {False: 0.0, True: 0.0}  # by `Hold.app`
        attempt = Attempt()
        while True:
            self._refuse_if_held(account, what)
            hold = pacer.ahead(account)
            if hold is not None and hold.until > attempt.through:
                self._wait(hold, what, waited, deadline, None)
                attempt.through = hold.until
            try:
                return send(attempt)
            except HoldAhead:
                continue
            except MetaError as exc:
                if exc.kind is not ErrorKind.THROTTLED:
                    raise
                hold = pacer.throttled(account, exc, attempt)
                if hold is None:
                    raise
                if not hold.in_run:
                    exc.regain_seconds = max(exc.regain_seconds or 0, hold.seconds)
                    raise
                self._wait(hold, what, waited, deadline, exc)
                attempt.through = max(attempt.through, hold.until)

    def _wait(
        self,
        hold: Hold,
        what: str,
        waited: dict[bool, float],
        deadline: Deadline | None,
        throttle: MetaError | None,
    ) -> None:
        """Sleep until `hold` ends, or raise `throttle` (or one saying the hold) when that
        is past what this request may still wait."""
        seconds = hold.until - self.pacer.now()
        if seconds <= 0:
            return
        most = IN_RUN_WAIT_MAX_SECONDS if hold.app else ACCOUNT_WAIT_IN_RUN_SECONDS
        past_deadline = deadline is not None and self.monotonic() + seconds >= deadline.at
        if waited[hold.app] + seconds > most or past_deadline:
            if throttle is not None:
                throttle.regain_seconds = max(throttle.regain_seconds or 0, math.ceil(seconds))
                raise throttle
            raise self._held_error(what, hold, math.ceil(seconds))
        waited[hold.app] += seconds
        log.info("%s waits %.0fs: held by %s", what, seconds, describe(hold.limit))
        self.sleep(seconds)

    def _hold_long(self, account: str | None, hold: Hold) -> None:
        if account is not None:
            self._long_holds[account] = (hold, self.pacer.now() + hold.seconds)

    def _refuse_if_held(self, account: str | None, what: str) -> None:
        held = None if account is None else self._long_holds.get(account)
        if account is None or held is None:
            return
        hold, ends = held
        left = ends - self.pacer.now()
        if left <= 0:
            self._long_holds.pop(account, None)
            return
        raise self._held_error(what, hold, math.ceil(left))

    @staticmethod
    def _held_error(what: str, hold: Hold, seconds: int) -> MetaError:
        return MetaError(
            ErrorKind.THROTTLED,
            f"{what} not sent: held {seconds}s by {describe(hold.limit)}",
            regain_seconds=seconds,
            limit=hold.limit,
        )

    def retrying(
        self,
        what: str,
        attempt: Callable[[], T],
        *,
        retry_timeouts: bool = True,
        deadline: Deadline | None = None,
    ) -> T:
        """`attempt()`, retried with back-off while it raises a TRANSIENT `MetaError`, and
        while the pause still ends before `deadline`."""
        retries = 0
        while True:
            try:
                return attempt()
            except MetaError as exc:
                retryable = exc.kind is ErrorKind.TRANSIENT and (
                    retry_timeouts or not isinstance(exc, TimedOut)
                )
                if (retryable or isinstance(exc, TimedOut)) and deadline is not None and (
                    self.monotonic() >= deadline.at
                ):
                    raise deadline.passed(what) from None
                if not retryable or retries >= self._max_retries:
                    raise
                delay = self._backoff_seconds(retries)
                if deadline is not None and self.monotonic() + delay >= deadline.at:
                    raise deadline.passed(what) from None
                retries += 1
                log.warning("%s failed: %s; retry %d of %d in %.1fs",
                            what, exc, retries, self._max_retries, delay)
                self.sleep(delay)

    def _backoff_seconds(self, retries: int) -> float:
        ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**retries)
        return ceiling * self._random.uniform(0.5, 1.0)

    def _once(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        data: Mapping[str, str] | None,
        what: str,
        read_page: PageReader | None,
        limits: Limits,
        account: str | None = None,
        attempt: Attempt | None = None,
    ) -> Any:
        pacer = self.pacer
        attempt = attempt or Attempt()
        # The answer's time starts once the request has its place among those in flight.
        with pacer.slot(self._token_key, account, attempt):
            now = self.monotonic()
            deadline = self._answer_deadline(now, limits.deadline)
            timeout = min(self.timeout_seconds, deadline.at - now)
            if timeout > 0:
                limits = Limits(limits.max_body_bytes, deadline)
                try:
                    response, raw = without_httpx_errors(
                        lambda: self._exchange(method, url, params, data, what, limits,
                                               timeout),
                        timed_out=f"Meta did not answer {what} within {timeout:g}s",
                        failed=f"the connection to Meta failed during {what}",
                    )
                except MetaError:
                    self._record(Usage())
                    raise
        if timeout <= 0:
            raise deadline.passed(what)
        decoded = decode_usage_headers(response.headers)
        usage = usage_of(decoded)
        pacer.read_app_load(*app_readings_of(decoded))
        try:
            body = self._decode(response, raw, what, read_page)
        except MetaError as exc:
            if exc.kind is ErrorKind.THROTTLED:
                usage = usage_of(decoded, throttled=True)
                exc.regain_seconds = usage.regain_seconds
            else:
                self._heed(account, usage, attempt)
            self._record(usage)
            raise
        self._record(usage)
        self._heed(account, usage, attempt)
        return body

    def _heed(self, account: str | None, usage: Usage, attempt: Attempt) -> None:
        """Tell the pacer of an answer that was no throttle; a hold on the account too long
        to wait in the run refuses its later requests of this session."""
        hold = self.pacer.answered(account, usage, attempt)
        if hold is not None and not hold.in_run:
            log.info("%s is at %.0f%% of %s: held %ds", account, usage.account_pct,
                     describe(hold.limit), hold.seconds)
            self._hold_long(account, hold)

    def _answer_deadline(self, now: float, read: Deadline | None) -> Deadline:
        """The sooner of the read's deadline and the answer's own: the request timeout bounds
        each wait for bytes, so an answer dribbled a byte at a time would never meet it."""
        seconds = ANSWER_TIMEOUTS * self.timeout_seconds
        if read is not None and read.at <= now + seconds:
            return read
        return Deadline(now + seconds, seconds, whole_read=False)

    def _exchange(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        data: Mapping[str, str] | None,
        what: str,
        limits: Limits,
        timeout: float,
    ) -> tuple[httpx.Response, bytes]:
        """The response and its body, read a chunk at a time and dropped (`OutOfBounds`) as
        soon as it is past the cap or the deadline: a slow or endless body ends here."""
        cap = limits.max_body_bytes
        with self.http.stream(
            method, url, params=params, data=data, timeout=httpx.Timeout(timeout),
            headers={"Authorization": f"Bearer {self._token.value}"},
        ) as response:
            status = response.status_code
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                raise too_big(what, cap, status)
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise too_big(what, cap, status)
                if limits.deadline is not None and self.monotonic() >= limits.deadline.at:
                    raise limits.deadline.passed(what)
                chunks.append(chunk)
        return response, b"".join(chunks)

    def _record(self, usage: Usage) -> None:
        with self._stats_lock:
            self.stats.record(usage)

    def _decode(
        self, response: httpx.Response, raw: bytes, what: str, read_page: PageReader | None
    ) -> Any:
        status = response.status_code
        content_type = response.headers.get("content-type", "").lower()
        if not raw.strip():
            raise MalformedResponse(
                f"Meta answered HTTP {status} with an empty body to {what}", http_status=status
            )
        if "html" in content_type or raw.lstrip()[:1] == b"<":
            raise MalformedResponse(
                f"Meta answered HTTP {status} with an HTML page instead of JSON to {what}",
                http_status=status,
            )
        if read_page is not None and status == 200:
            page = read_page(raw)
            if page is not None:
                return page
        try:
            body = json.loads(raw, parse_float=Decimal)
        except ValueError:
            raise MalformedResponse(
                f"Meta answered HTTP {status} with a body that is not valid JSON to {what}",
                http_status=status,
            ) from None
        if isinstance(body, dict) and isinstance(body.get("error"), Mapping):
            raise classify_error(body["error"], http_status=status, regain_seconds=None,
                                 scrub=self.scrub)
        if status >= 400:
            kind = ErrorKind.TRANSIENT if status >= 500 else ErrorKind.OTHER
            raise MetaError(kind, f"Meta answered HTTP {status} without an error object to {what}",
                            http_status=status)
        if not isinstance(body, dict):
            raise MalformedResponse(
                f"Meta answered {what} with JSON that is not an object", http_status=status
            )
        return body
