"""The Meta Graph (Marketing) API client: the facade the sync and the CLI use.

Requests, retries, decoding and paging are `session.GraphSession`'s;
insights reading is `insights.InsightsReader`'s; CDN thumbnails are
`thumbnails.fetch_thumbnail`'s. This module holds the catalog reads.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date

import httpx

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.meta.bounds import ReadBounds
from rastro_assets.meta.errors import UNKNOWN_ALIAS_CODE, MetaError
from rastro_assets.meta.insights import (
    RANGE_CONCURRENCY,
    TARGET_ROWS_PER_RANGE,
    InsightsReader,
)
from rastro_assets.meta.models import (
    EFFECTIVE_STATUSES,
    Ad,
    AdAccount,
    CallStats,
    InsightsChunk,
    Thumbnail,
)
from rastro_assets.meta.pacing import Pacer
from rastro_assets.meta.parse import parse_account, parse_ad, parse_listed_account
from rastro_assets.meta.session import GraphSession, check_token_text
from rastro_assets.meta.thumbnails import fetch_thumbnail

log = logging.getLogger(__name__)

AD_FIELDS = (
    "id,name,adset_id,adset{name},campaign_id,campaign{name},effective_status,"
    "creative{thumbnail_url,object_type,image_url,video_id,asset_feed_spec,object_story_spec}"
)
ACCOUNT_FIELDS = "name,currency,timezone_name,timezone_offset_hours_utc,account_status"
LISTED_ACCOUNT_FIELDS = "account_id,name,currency,timezone_name,account_status"
MAX_IDS_PER_CALL = 50
# The listing of what a token reaches: 400 pages of up to 500 accounts is more than any
# Business Manager holds, an accounts page is a few hundred bytes an account, and someone waits
# at a terminal for it; a Graph that pages on without end, or dribbles, stops there.
ACCOUNT_LISTING_BOUNDS = ReadBounds(max_body_bytes=4 << 20, max_pages=400, seconds=300)

_AD_ID_RE = re.compile(r"^\d+$")


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
        range_concurrency: insights ranges of one read in flight at once.
        range_rows: rows an insights range sized from a known rate aims at.
        pacer: what paces its requests with the process's others (None: the process's own).
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
        range_concurrency: int = RANGE_CONCURRENCY,
        range_rows: int = TARGET_ROWS_PER_RANGE,
        pacer: Pacer | None = None,
    ) -> None:
        check_token_text(token)
        if page_size < 1 or max_retries < 0 or timeout_seconds <= 0:
            raise ValueError("page_size and timeout_seconds must be positive, max_retries >= 0")
        self._session = GraphSession(
            token, base_url=base_url, transport=transport, timeout_seconds=timeout_seconds,
            max_retries=max_retries, sleep=sleep, pacer=pacer,
        )
        self._page_size = page_size
        self._insights = InsightsReader(
            self._session, page_size=page_size, async_poll_seconds=async_poll_seconds,
            async_timeout_seconds=async_timeout_seconds, range_concurrency=range_concurrency,
            range_rows=range_rows,
        )

    @property
    def stats(self) -> CallStats:
        """Calls made and the peak usage seen, over every request of this client."""
        return self._session.stats

    def __repr__(self) -> str:
        return f"MetaClient(base_url={self._session.base_url!r})"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> MetaClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- public API -------------------------------------------------------

    def insights(
        self, ad_account_id: str, since: date, until: date, *, rows_per_day: int | None = None
    ) -> Iterator[InsightsChunk]:
        """Every ad-day of [since, until], as chunks in date order.

        Each day is covered by exactly one chunk. Ranges are sized from
        `rows_per_day` (the most rows a day of the account held lately) and
        from each answer; with nothing known the whole range is tried first.
        When Meta says a range is too much (or does not answer in time) it is
        split, down to single days, and a single day that is still too much
        runs as an async report job. A few ranges are read at once. A chunk is
        `complete` only if every page was read; a day whose async job failed
        or timed out comes back incomplete. Any other failure starts no more
        ranges (a throttle also stops those in flight) and raises `MetaError`
        after the chunks read completely, which stay valid.
        """
        act = normalize_account_id(ad_account_id)
        if since > until:
            raise ValueError(f"since {since} is after until {until}")
        return self._insights.chunks(act, since, until, rows_per_day=rows_per_day)

    def ads(self, ad_account_id: str) -> Iterator[Ad]:
        """The account's whole catalog, every effective status, paged."""
        act = normalize_account_id(ad_account_id)
        return self._ads(act)

    def ads_by_id(self, ad_ids: Sequence[str], *, ad_account_id: str | None = None) -> list[Ad]:
        """The ads among `ad_ids` that Meta knows, in the order asked.

        Calls carry at most 50 ids. Meta fails a whole call with code 803 when
        one id is unknown, so such a call is retried in halves until the
        unknown ids stand alone; they are left out of the answer.
        `ad_account_id`: the account the ads belong to, whose limit the calls count against.
        """
        act = normalize_account_id(ad_account_id) if ad_account_id is not None else None
        wanted = list(dict.fromkeys(str(ad_id).strip() for ad_id in ad_ids))
        valid = [ad_id for ad_id in wanted if _AD_ID_RE.match(ad_id)]
        if len(valid) < len(wanted):
            log.info("skipping %d ad ids that are not numeric", len(wanted) - len(valid))
        found: dict[str, Ad] = {}
        for start in range(0, len(valid), MAX_IDS_PER_CALL):
            self._ads_batch(valid[start : start + MAX_IDS_PER_CALL], found, act)
        return [found[ad_id] for ad_id in valid if ad_id in found]

    def account(self, ad_account_id: str) -> AdAccount:
        """Name, currency, timezone and status of an ad account."""
        act = normalize_account_id(ad_account_id)
        body = self._session.call("GET", act, params={"fields": ACCOUNT_FIELDS},
                                  what=f"GET {act}", account=act)
        return parse_account(body, act)

    def reachable_accounts(self, bounds: ReadBounds | None = None) -> list[AdAccount]:
        """Every ad account the token reaches (`GET /me/adaccounts`, every page), each once,
        in Meta's order; `OutOfBounds` past `bounds` (default `ACCOUNT_LISTING_BOUNDS`)."""
        params = {"fields": LISTED_ACCOUNT_FIELDS, "limit": str(self._page_size)}
        found: dict[str, AdAccount] = {}
        bounds = ACCOUNT_LISTING_BOUNDS if bounds is None else bounds
        for page in self._session.pages("me/adaccounts", params, what="GET me/adaccounts",
                                        bounds=bounds):
            for raw in page:
                account = parse_listed_account(raw)
                found.setdefault(account.ad_account_id, account)
        return list(found.values())

    def check_token(self) -> None:
        """Raise `MetaError` unless Meta accepts the token (`GET /me`)."""
        self._session.call("GET", "me", params={"fields": "id"}, what="GET me")

    def thumbnail(self, url: str, *, max_bytes: int = 5_000_000) -> Thumbnail:
        """Copy an image from Meta's CDN.

        The URL is signed and expires; no token is sent with it. Raises
        `MetaError` (OTHER: refused, not an image, too big; TRANSIENT: the CDN
        or the network failed, after retries). Messages name the URL without
        its query string, which holds the signature.
        """
        return fetch_thumbnail(self._session, url, max_bytes=max_bytes)

    # -- catalog ---------------------------------------------------------------

    def _ads(self, act: str) -> Iterator[Ad]:
        params = {
            "fields": AD_FIELDS,
            "effective_status": json.dumps(list(EFFECTIVE_STATUSES), separators=(",", ":")),
            "limit": str(self._page_size),
        }
        seen: set[str] = set()
        for page in self._session.pages(f"{act}/ads", params, what=f"GET {act}/ads",
                                        account=act):
            for raw in page:
                ad = parse_ad(raw, act)
                if ad.ad_id not in seen:
                    seen.add(ad.ad_id)
                    yield ad

    def _ads_batch(self, ad_ids: list[str], found: dict[str, Ad], act: str | None) -> None:
        try:
            body = self._session.call(
                "GET", "", params={"ids": ",".join(ad_ids), "fields": AD_FIELDS},
                what=f"GET ?ids= ({len(ad_ids)} ads)", account=act,
            )
        except MetaError as exc:
            if exc.code != UNKNOWN_ALIAS_CODE:
                raise
            if len(ad_ids) == 1:
                log.info("Meta does not know ad %s", ad_ids[0])
                return
            middle = len(ad_ids) // 2
            self._ads_batch(ad_ids[:middle], found, act)
            self._ads_batch(ad_ids[middle:], found, act)
            return
        asked = set(ad_ids)
        for key, raw in body.items():
            if key in asked and isinstance(raw, Mapping):
                ad = parse_ad(raw)
                found[ad.ad_id] = ad
