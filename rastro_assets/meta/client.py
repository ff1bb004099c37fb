"""The Meta Graph (Marketing) API client.

The token travels only in the `Authorization` header, so no URL, message,
repr or log line built here can contain it; Meta's own error messages are
scrubbed too, in case Meta ever echoes it. httpx exceptions are converted to
`MetaError` without their text or chain.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date, timedelta
from decimal import Decimal
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from rastro_assets.meta.errors import ErrorKind, MalformedResponse, MetaError
from rastro_assets.meta.models import (
    INSIGHT_SCHEMA,
    Ad,
    AdAccount,
    CallStats,
    InsightsChunk,
    Thumbnail,
    Usage,
)
from rastro_assets.meta.parse import (
    UNKNOWN_ALIAS_CODE,
    InsightsPage,
    classify_error,
    parse_account,
    parse_ad,
    parse_insight_table,
    read_insights_page,
)
from rastro_assets.meta.usage import parse_usage

log = logging.getLogger(__name__)

INSIGHTS_FIELDS = (
    "ad_id,ad_name,adset_id,adset_name,campaign_id,campaign_name,spend,impressions,clicks,"
    "actions,date_start,date_stop,account_currency"
)
AD_FIELDS = (
    "id,name,adset_id,adset{name},campaign_id,campaign{name},effective_status,"
    "creative{thumbnail_url,object_type,image_url,video_id,asset_feed_spec,object_story_spec}"
)
ACCOUNT_FIELDS = "name,currency,timezone_name,timezone_offset_hours_utc,account_status"
REPORT_FIELDS = "async_status,async_percent_completion"
EFFECTIVE_STATUSES = (
    "ACTIVE",
    "ADSET_PAUSED",
    "ARCHIVED",
    "CAMPAIGN_PAUSED",
    "DELETED",
    "DISAPPROVED",
    "IN_PROCESS",
    "PAUSED",
    "PENDING_BILLING_INFO",
    "PENDING_REVIEW",
    "PREAPPROVED",
    "WITH_ISSUES",
)
MAX_IDS_PER_CALL = 50
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 60.0
ASYNC_DONE = "Job Completed"
ASYNC_GAVE_UP = frozenset({"Job Failed", "Job Skipped"})
THUMBNAIL_REASON_CHARS = 120

_ACCOUNT_RE = re.compile(r"^(?:act_)?(\d+)$")


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every client of the process.

    Building one loads the CA bundle (~40 ms of CPU); a wave builds a client per
    account sync, hundreds per run.
    """
    return httpx.create_ssl_context()
_AD_ID_RE = re.compile(r"^\d+$")
_NODE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_QUERY_RE = re.compile(r"\?\S*")

T = TypeVar("T")
# Reads an HTTP 200 body straight into a page; None: decode it with `json` as usual.
PageReader = Callable[[bytes], InsightsPage | None]


class _Secret:
    """Holds the token so that no repr, `vars()` dump or f-string shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


class _TimedOut(MetaError):
    """No answer within the timeout: for insights, a sign of too much data."""


def normalize_account_id(ad_account_id: str) -> str:
    """`act_<digits>` from `act_<digits>` or bare digits; ValueError otherwise."""
    match = _ACCOUNT_RE.match(str(ad_account_id).strip())
    if not match:
        raise ValueError(f"not an ad account id: {ad_account_id!r:.40} (want act_<digits>)")
    return f"act_{match.group(1)}"


def _by_day_and_ad(pages: list[pa.Table]) -> pa.Table:
    """One row per ad-day (a later copy wins: pages may repeat a row), by day then ad id.

    Arrow orders strings by their UTF-8 bytes, which is code point order, as
    Python's `sorted` does.
    """
    table = pa.concat_tables(pages) if pages else INSIGHT_SCHEMA.empty_table()
    count = table.num_rows
    if count < 2:
        return table
    day, ad_id = table["day"], table["ad_id"]
    earlier_day, later_day = day.slice(0, count - 1), day.slice(1)
    in_order = pc.or_(
        pc.less(earlier_day, later_day),
        pc.and_(pc.equal(earlier_day, later_day),
                pc.less(ad_id.slice(0, count - 1), ad_id.slice(1))),
    )
    if pc.all(in_order).as_py():
        return table  # already in order, so no repeats either
    position = pa.array(range(count), pa.int64())
    latest = (
        table.select(["day", "ad_id"])
        .append_column("position", position)
        .group_by(["day", "ad_id"], use_threads=False)
        .aggregate([("position", "max")])
    )
    return table.take(latest["position_max"]).sort_by([("day", "ascending"),
                                                       ("ad_id", "ascending")])


def _without_query(url: httpx.URL) -> str:
    """The URL without its query: signed CDN URLs keep their secret there."""
    return str(url.copy_with(query=None, fragment=None))


class MetaClient:
    """One Meta connection: an httpx client, its token, and what it spent.

    Args:
        token: the access token, sent only as `Authorization: Bearer`.
        base_url: Graph base including the version, e.g.
            `https://graph.facebook.com/v25.0`.
        transport: an httpx transport (the fake Graph's, in tests).
        timeout_seconds: the timeout of every request.
        max_retries: retries of a transient failure before it is raised.
        page_size: `limit` asked for on paged endpoints.
        sleep: how to wait (injected so tests never wait).
        async_poll_seconds: the wait between polls of an async report job.
        async_timeout_seconds: how long to wait for an async report job.
    """

    def __init__(
        self,
        token: str,
        *,
        base_url: str,
        transport: httpx.BaseTransport | None = None,
        timeout_seconds: float = 60,
        max_retries: int = 3,
        page_size: int = 500,
        sleep: Callable[[float], None] = time.sleep,
        async_poll_seconds: float = 2.0,
        async_timeout_seconds: float = 600,
    ) -> None:
        if not isinstance(token, str) or not token.strip() or token != token.strip():
            raise ValueError("the Meta access token is empty or has surrounding whitespace")
        if any(ch in token for ch in "\r\n\0"):
            raise ValueError("the Meta access token is not a single line")
        if page_size < 1 or max_retries < 0 or timeout_seconds <= 0:
            raise ValueError("page_size and timeout_seconds must be positive, max_retries >= 0")
        self._token = _Secret(token)
        self._base_url = base_url.rstrip("/")
        self._timeout_seconds = timeout_seconds
        self._max_retries = max_retries
        self._page_size = page_size
        self._sleep = sleep
        self._async_poll_seconds = async_poll_seconds
        self._async_timeout_seconds = async_timeout_seconds
        self._random = random.Random()
        self._http = httpx.Client(
            transport=transport,
            verify=_shared_ssl_context(),
            timeout=httpx.Timeout(timeout_seconds),
            follow_redirects=False,
            headers={"User-Agent": "rastro-assets"},
        )
        self.stats = CallStats()

    def __repr__(self) -> str:
        return f"MetaClient(base_url={self._base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MetaClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- public API -------------------------------------------------------

    def insights(self, ad_account_id: str, since: date, until: date) -> Iterator[InsightsChunk]:
        """Every ad-day of [since, until], as chunks in date order.

        Each day is covered by exactly one chunk. The whole range is tried
        first; when Meta says it is too much (or does not answer in time) the
        range is halved, down to single days, and a single day that is still
        too much runs as an async report job. A chunk is `complete` only if
        every page was read; a day whose async job failed or timed out comes
        back incomplete. Any other failure raises `MetaError`, and the chunks
        already yielded stay valid.
        """
        act = normalize_account_id(ad_account_id)
        if since > until:
            raise ValueError(f"since {since} is after until {until}")
        return self._insights_range(act, since, until)

    def ads(self, ad_account_id: str) -> Iterator[Ad]:
        """The account's whole catalog, every effective status, paged."""
        act = normalize_account_id(ad_account_id)
        return self._ads(act)

    def ads_by_id(self, ad_ids: Sequence[str]) -> list[Ad]:
        """The ads among `ad_ids` that Meta knows, in the order asked.

        Calls carry at most 50 ids. Meta fails a whole call with code 803 when
        one id is unknown, so such a call is retried in halves until the
        unknown ids stand alone; they are left out of the answer.
        """
        wanted = list(dict.fromkeys(str(ad_id).strip() for ad_id in ad_ids))
        valid = [ad_id for ad_id in wanted if _AD_ID_RE.match(ad_id)]
        if len(valid) < len(wanted):
            log.info("skipping %d ad ids that are not numeric", len(wanted) - len(valid))
        found: dict[str, Ad] = {}
        for start in range(0, len(valid), MAX_IDS_PER_CALL):
            self._ads_batch(valid[start : start + MAX_IDS_PER_CALL], found)
        return [found[ad_id] for ad_id in valid if ad_id in found]

    def account(self, ad_account_id: str) -> AdAccount:
        """Name, currency, timezone and status of an ad account."""
        act = normalize_account_id(ad_account_id)
        body = self._call("GET", act, params={"fields": ACCOUNT_FIELDS}, what=f"GET {act}")
        return parse_account(body, act)

    def check_token(self) -> None:
        """Raise `MetaError` unless Meta accepts the token (`GET /me`)."""
        self._call("GET", "me", params={"fields": "id"}, what="GET me")

    def thumbnail(self, url: str, *, max_bytes: int = 5_000_000) -> Thumbnail:
        """Copy an image from Meta's CDN.

        The URL is signed and expires; no token is sent with it. Raises
        `MetaError` (OTHER: refused, not an image, too big; TRANSIENT: the CDN
        or the network failed, after retries). Messages name the URL without
        its query string, which holds the signature.
        """
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError):
            raise MetaError(ErrorKind.OTHER, "thumbnail URL is not a valid URL") from None
        safe = _without_query(parsed)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise MetaError(ErrorKind.OTHER, f"thumbnail URL {safe} is not an http(s) URL")
        return self._retrying(
            f"thumbnail {safe}", lambda: self._fetch_thumbnail(parsed, safe, max_bytes)
        )

    # -- insights -----------------------------------------------------------

    def _insights_range(self, act: str, since: date, until: date) -> Iterator[InsightsChunk]:
        try:
            table = self._read_insights(act, since, until)
        except MetaError as exc:
            if not (exc.kind is ErrorKind.TOO_MUCH_DATA or isinstance(exc, _TimedOut)):
                raise
            reason = str(exc)
        else:
            yield InsightsChunk(since=since, until=until, table=table, complete=True)
            return
        if since == until:
            log.info("%s %s is too much for one request (%s); running an async report",
                     act, since, reason)
            yield self._read_async(act, since)
            return
        middle = since + timedelta(days=(until - since).days // 2)
        log.info("%s %s..%s is too much for one request (%s); splitting",
                 act, since, until, reason)
        yield from self._insights_range(act, since, middle)
        yield from self._insights_range(act, middle + timedelta(days=1), until)

    def _insights_params(self, since: date, until: date) -> dict[str, str]:
        return {
            "level": "ad",
            "time_increment": "1",
            "time_range": json.dumps(
                {"since": since.isoformat(), "until": until.isoformat()}, separators=(",", ":")
            ),
            "fields": INSIGHTS_FIELDS,
            "filtering": json.dumps(
                [{"field": "ad.effective_status", "operator": "IN",
                  "value": list(EFFECTIVE_STATUSES)}],
                separators=(",", ":"),
            ),
        }

    def _read_insights(self, act: str, since: date, until: date) -> pa.Table:
        params = self._insights_params(since, until) | {"limit": str(self._page_size)}
        pages: list[pa.Table] = []
        texts: dict[str, str] = {}
        what = f"GET {act}/insights {since}..{until}"
        for page in self._pages(f"{act}/insights", params, what=what, retry_timeouts=False,
                                read_page=self._page_reader(since, until)):
            pages.append(
                page if isinstance(page, pa.Table)
                else parse_insight_table(page, since, until, texts)
            )
        return _by_day_and_ad(pages)

    @staticmethod
    def _page_reader(since: date, until: date) -> PageReader:
        return lambda body: read_insights_page(body, since, until)

    def _read_async(self, act: str, day: date) -> InsightsChunk:
        def incomplete(pages: Sequence[pa.Table] = ()) -> InsightsChunk:
            return InsightsChunk(
                since=day, until=day, table=_by_day_and_ad(list(pages)), complete=False
            )

        what = f"async report for {act} on {day}"
        try:
            body = self._call("POST", f"{act}/insights", data=self._insights_params(day, day),
                              what=f"POST {act}/insights {day}")
        except MetaError as exc:
            if exc.kind is not ErrorKind.TOO_MUCH_DATA:
                raise
            log.warning("%s could not start: %s", what, exc)
            return incomplete()
        run_id = body.get("report_run_id")
        if isinstance(run_id, int) and not isinstance(run_id, bool):
            run_id = str(run_id)
        if not isinstance(run_id, str) or not _NODE_ID_RE.match(run_id):
            raise MalformedResponse(f"Meta started {what} without a usable 'report_run_id'")

        waited_seconds = 0.0
        started = time.monotonic()
        while True:
            job = self._call("GET", run_id, params={"fields": REPORT_FIELDS},
                             what=f"GET report {run_id}")
            status = job.get("async_status")
            if status == ASYNC_DONE:
                break
            if not isinstance(status, str):
                raise MalformedResponse(f"report {run_id} answered without an 'async_status'")
            if status in ASYNC_GAVE_UP:
                log.warning("%s ended %r (error %s: %s); the day stays incomplete", what,
                            status, job.get("error_code"),
                            self._scrub(str(job.get("error_message"))))
                return incomplete()
            elapsed = max(waited_seconds, time.monotonic() - started)
            if elapsed >= self._async_timeout_seconds:
                log.warning("%s still %r after %.0fs; the day stays incomplete",
                            what, status, elapsed)
                return incomplete()
            self._sleep(self._async_poll_seconds)
            waited_seconds += self._async_poll_seconds

        pages: list[pa.Table] = []
        texts: dict[str, str] = {}
        try:
            for page in self._pages(f"{run_id}/insights", {"limit": str(self._page_size)},
                                    what=f"GET report {run_id}/insights",
                                    read_page=self._page_reader(day, day)):
                pages.append(
                    page if isinstance(page, pa.Table)
                    else parse_insight_table(page, day, day, texts)
                )
        except MetaError as exc:
            if exc.kind is not ErrorKind.TOO_MUCH_DATA:
                raise
            log.warning("%s could not be read in full: %s", what, exc)
            return incomplete(pages)
        return InsightsChunk(since=day, until=day, table=_by_day_and_ad(pages), complete=True)

    # -- catalog ---------------------------------------------------------------

    def _ads(self, act: str) -> Iterator[Ad]:
        params = {
            "fields": AD_FIELDS,
            "effective_status": json.dumps(list(EFFECTIVE_STATUSES), separators=(",", ":")),
            "limit": str(self._page_size),
        }
        seen: set[str] = set()
        for page in self._pages(f"{act}/ads", params, what=f"GET {act}/ads"):
            for raw in page:
                ad = parse_ad(raw, act)
                if ad.ad_id not in seen:
                    seen.add(ad.ad_id)
                    yield ad

    def _ads_batch(self, ad_ids: list[str], found: dict[str, Ad]) -> None:
        try:
            body = self._call("GET", "", params={"ids": ",".join(ad_ids), "fields": AD_FIELDS},
                              what=f"GET ?ids= ({len(ad_ids)} ads)")
        except MetaError as exc:
            if exc.code != UNKNOWN_ALIAS_CODE:
                raise
            if len(ad_ids) == 1:
                log.info("Meta does not know ad %s", ad_ids[0])
                return
            middle = len(ad_ids) // 2
            self._ads_batch(ad_ids[:middle], found)
            self._ads_batch(ad_ids[middle:], found)
            return
        asked = set(ad_ids)
        for key, raw in body.items():
            if key in asked and isinstance(raw, Mapping):
                ad = parse_ad(raw)
                found[ad.ad_id] = ad

    # -- paging, requests, retries ---------------------------------------------

    def _pages(
        self,
        path: str,
        params: Mapping[str, str],
        *,
        what: str,
        retry_timeouts: bool = True,
        read_page: PageReader | None = None,
    ) -> Iterator[list[Any] | pa.Table]:
        """Each page's `data`, following `after` cursors while `next` is given.

        With `read_page`, a page it reads comes as its table; any other as the
        `data` list `json` decoded.
        """
        after: str | None = None
        next_url: str | None = None
        seen: set[str] = set()
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
            body = self._call("GET", url, what=what, retry_timeouts=retry_timeouts,
                              read_page=read_page)
            if isinstance(body, InsightsPage):
                yield body.table
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
        base = httpx.URL(self._base_url)
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
            raise MalformedResponse(
                f"Meta's 'next' URL during {what} leaves {base.host}; not following it"
            )
        return str(url.copy_remove_param("access_token"))

    def _url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
        return f"{self._base_url}/{path_or_url}"

    def _call(
        self,
        method: str,
        path_or_url: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        data: Mapping[str, str] | None = None,
        retry_timeouts: bool = True,
        read_page: PageReader | None = None,
    ) -> Any:
        """The decoded body: a dict, or what `read_page` made of it."""
        return self._retrying(
            what,
            lambda: self._once(method, self._url(path_or_url), params, data, what, read_page),
            retry_timeouts=retry_timeouts,
        )

    def _retrying(self, what: str, attempt: Callable[[], T], *, retry_timeouts: bool = True) -> T:
        retries = 0
        while True:
            try:
                return attempt()
            except MetaError as exc:
                retryable = exc.kind is ErrorKind.TRANSIENT and (
                    retry_timeouts or not isinstance(exc, _TimedOut)
                )
                if not retryable or retries >= self._max_retries:
                    raise
                delay = self._backoff_seconds(retries)
                retries += 1
                log.warning("%s failed: %s; retry %d of %d in %.1fs",
                            what, exc, retries, self._max_retries, delay)
                self._sleep(delay)

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
        read_page: PageReader | None = None,
    ) -> Any:
        # Raised outside the `except` so the httpx exception (which holds the
        # request, Authorization header included) is not even its __context__.
        failure: MetaError | None = None
        try:
            response = self._http.request(
                method, url, params=params, data=data,
                headers={"Authorization": f"Bearer {self._token.value}"},
            )
        except httpx.TimeoutException:
            failure = _TimedOut(
                ErrorKind.TRANSIENT,
                f"Meta did not answer {what} within {self._timeout_seconds:g}s",
            )
        except httpx.HTTPError as exc:
            failure = MetaError(
                ErrorKind.TRANSIENT,
                f"the connection to Meta failed during {what} ({type(exc).__name__})",
            )
        if failure is not None:
            self.stats.record(Usage())
            raise failure
        usage = parse_usage(response.headers)
        try:
            body = self._decode(response, what, read_page)
        except MetaError as exc:
            if exc.kind is ErrorKind.THROTTLED:
                usage = parse_usage(response.headers, throttled=True)
                exc.regain_seconds = usage.regain_seconds
            self.stats.record(usage)
            raise
        self.stats.record(usage)
        return body

    def _decode(
        self, response: httpx.Response, what: str, read_page: PageReader | None = None
    ) -> Any:
        status = response.status_code
        raw = response.content
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
                                 scrub=self._scrub)
        if status >= 400:
            kind = ErrorKind.TRANSIENT if status >= 500 else ErrorKind.OTHER
            raise MetaError(kind, f"Meta answered HTTP {status} without an error object to {what}",
                            http_status=status)
        if not isinstance(body, dict):
            raise MalformedResponse(
                f"Meta answered {what} with JSON that is not an object", http_status=status
            )
        return body

    def _scrub(self, text: str) -> str:
        return text.replace(self._token.value, "[token]")

    # -- thumbnails ------------------------------------------------------------

    def _fetch_thumbnail(self, url: httpx.URL, safe: str, max_bytes: int) -> Thumbnail:
        failure: MetaError | None = None
        try:
            with self._http.stream("GET", url, follow_redirects=True) as response:
                status = response.status_code
                if status != 200:
                    raise self._thumbnail_refusal(response, safe)
                content_type = response.headers.get("content-type", "")
                content_type = content_type.split(";")[0].strip().lower()
                if not content_type.startswith("image/"):
                    raise MetaError(
                        ErrorKind.OTHER,
                        f"thumbnail {safe} answered {content_type or 'no content type'}, "
                        "not an image",
                        http_status=status,
                    )
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise MetaError(
                        ErrorKind.OTHER,
                        f"thumbnail {safe} is {declared} bytes, over the {max_bytes}-byte cap",
                        http_status=status,
                    )
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise MetaError(
                            ErrorKind.OTHER,
                            f"thumbnail {safe} is over the {max_bytes}-byte cap",
                            http_status=status,
                        )
                    chunks.append(chunk)
        except httpx.TimeoutException:
            failure = MetaError(
                ErrorKind.TRANSIENT,
                f"thumbnail {safe} did not arrive within {self._timeout_seconds:g}s",
            )
        except httpx.HTTPError as exc:
            failure = MetaError(
                ErrorKind.TRANSIENT, f"fetching thumbnail {safe} failed ({type(exc).__name__})"
            )
        if failure is not None:
            raise failure
        data = b"".join(chunks)
        if not data:
            raise MetaError(ErrorKind.OTHER, f"thumbnail {safe} is empty", http_status=status)
        return Thumbnail(content_type=content_type, data=data)

    def _thumbnail_refusal(self, response: httpx.Response, safe: str) -> MetaError:
        status = response.status_code
        reason = ""
        if response.headers.get("content-type", "").lower().startswith("text/plain"):
            head = b""
            for chunk in response.iter_bytes():
                head += chunk
                if len(head) >= THUMBNAIL_REASON_CHARS:
                    break
            text = head[:THUMBNAIL_REASON_CHARS].decode("utf-8", "replace").strip()
            text = _QUERY_RE.sub("", " ".join(text.split()))
            reason = f": {self._scrub(text)}" if text else ""
        kind = ErrorKind.TRANSIENT if status >= 500 or status == 429 else ErrorKind.OTHER
        return MetaError(kind, f"thumbnail {safe} answered HTTP {status}{reason}",
                         http_status=status)
