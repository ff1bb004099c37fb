"""A deterministic Meta world: accounts, ads, daily delivery, and failure switches.

Everything the fake Graph answers comes from here, as a pure function of the
seed, the accounts and ads added, test overrides, and the world clock. Two
processes that build the same world and read the same clock see the same
figures, catalog and thumbnails.

The world's rules, as the facts page describes Meta:
- an ad delivers on most days (a hash of seed, account, ad and day); days
  without delivery are absent, never zero rows;
- today's figures grow through the account-local day; a day's figures keep
  settling for 28 days after it ends (`SETTLE_DAYS`) and are fixed after;
- a few ad-days exist while young and vanish later (corrected to nothing);
- ads that are paused, deleted, archived or disapproved stop delivering on a
  fixed day, but their past spend stays (insights leave DELETED and ARCHIVED
  ads out unless the `ad.effective_status` filter names them);
- no figures after the account-local now, none older than 37 months;
- Meta's rate limits, as `limits` (a `LimitModel`) chooses them, counted in `ledger`
  (`rastro_fake_graph.limits` describes each).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from rastro_assets.meta.models import InsightRow
from rastro_assets.timekeeping import Clock, local_date, local_midnight, system_clock, zone
from rastro_fake_graph.images import png
from rastro_fake_graph.limits import INSIGHTS, MANAGEMENT, LimitLedger, LimitModel

DEMO_TOKEN = "EAAFakeRastroDemoToken0000000000"
DEMO_SEED = 2026
# The demo world's accounts that `rastro demo` does not link, for rehearsing `rastro accounts`
# and `rastro link --all`: zones east and west, a half-hour offset (Kolkata), the far east of
# UTC+10 (Auckland), and a currency with no minor unit (KRW).
DEMO_UNLINKED = {
    "act_1004": ("Europe/Berlin", "EUR", "Berliner Kaufhaus"),
    "act_1005": ("Asia/Kolkata", "INR", "Mumbai Bazaar"),
    "act_1006": ("Australia/Sydney", "AUD", "Bondi Supply Co"),
    "act_1007": ("Pacific/Auckland", "NZD", "Kiwi Outdoors"),
    "act_1008": ("Asia/Seoul", "KRW", "서울 마켓"),
}
GRAPH_VERSION = "v25.0"
CDN_HOST = "fake-cdn.rastro.test"
CDN_BASE = f"https://{CDN_HOST}"

SETTLE_DAYS = 28
RETENTION_MONTHS = 37
DELIVERY_SHARE = 0.82
VANISH_SHARE = 0.04
TODAY_SHARE_OF_FINAL = 0.92
SETTLE_SWING = 0.08
DEFAULT_ROW_CAP = 5000
MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 25
MAX_IDS_PER_CALL = 50
THUMBNAIL_TTL = timedelta(days=3)
THUMBNAIL_SIZE_PX = 64
MAX_THUMBNAIL_SIZE_PX = 1080
ASYNC_POLLS_TO_FINISH = 3
DEFAULT_REGAIN_MINUTES = 5
SERVER_STALL_SECONDS = 3.0
# A "slow_body" answer comes a byte at a time this far apart; a "huge_body" one is this long
# and declares no length, so only the bytes themselves say how big it is.
SLOW_BODY_BYTE_SECONDS = 1.0
HUGE_BODY_BYTES = 50 << 20
# Stopped ads without an account `first_day` stop relative to this fixed day,
# so the world never depends on when it was built.
STOP_ANCHOR_DAY = date(2026, 1, 1)
MAX_ADS_PER_ACCOUNT = 9999

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
HIDDEN_UNLESS_FILTERED = frozenset({"DELETED", "ARCHIVED"})
STOPPED_STATUSES = frozenset(
    {"PAUSED", "DELETED", "ARCHIVED", "ADSET_PAUSED", "CAMPAIGN_PAUSED", "DISAPPROVED"}
)
STATUS_CYCLE = (
    "ACTIVE", "ACTIVE", "PAUSED", "ACTIVE", "DELETED",
    "ACTIVE", "ARCHIVED", "ACTIVE", "CAMPAIGN_PAUSED", "ACTIVE",
    "ADSET_PAUSED", "ACTIVE", "WITH_ISSUES", "ACTIVE", "DISAPPROVED",
    "ACTIVE", "IN_PROCESS", "ACTIVE", "PENDING_REVIEW", "ACTIVE",
)
CREATIVE_KINDS = ("video", "image", "carousel", "photo", "other")
# Meta's currency offsets: 1 (no minor unit) for these, 100 otherwise.
ZERO_DECIMAL_CURRENCIES = frozenset(
    {"CLP", "COP", "CRC", "HUF", "ISK", "IDR", "JPY", "KRW", "PYG", "TWD", "VND"}
)
UNITS_PER_USD = {
    "USD": 1.0, "BRL": 5.4, "JPY": 150.0, "EUR": 0.92, "GBP": 0.79, "MXN": 18.0,
    "AUD": 1.52, "INR": 84.0, "KRW": 1380.0,
}
MESSAGING_ACTION = "onsite_conversion.messaging_conversation_started_7d"

AD_NAME_WORDS = {
    "BRL": ("Promoção Verão ☀️", "Coleção Inverno", "Liquidação Relâmpago", "Frete Grátis"),
    "JPY": ("春のセール", "夏の新作", "送料無料キャンペーン", "限定コレクション"),
}
DEFAULT_AD_NAME_WORDS = ("Spring Sale", "New Arrivals", "Retargeting", "Lookalike Test")

TOKEN_SUBCODES = (458, 459, 460, 463, 464, 467, 492)
THROTTLE_CODES = (4, 17, 32, 613, *range(80000, 80015))


@dataclass(frozen=True, slots=True)
class Figures:
    """One ad-day's figures as Meta would report them."""

    spend: Decimal
    impressions: int
    clicks: int
    conversations: int = 0


@dataclass(slots=True)
class FakeAd:
    ad_id: str
    ad_account_id: str
    name: str
    adset_id: str
    adset_name: str
    campaign_id: str
    campaign_name: str
    effective_status: str
    creative_kind: str
    creative_version: int = 1
    delivers_from: date | None = None
    delivers_until: date | None = None

    @property
    def creative_id(self) -> str:
        return f"{self.ad_id}{self.creative_version:02d}"


@dataclass(slots=True)
class FakeAccount:
    ad_account_id: str
    name: str
    timezone: str
    currency: str
    account_status: int
    first_day: date | None
    business_id: str
    ads: dict[str, FakeAd] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FailureSpec:
    """How one failure switch answers: an error object, a broken body, or a fault."""

    status: int = 400
    code: int | None = None
    subcode: int | None = None
    message: str = ""
    error_type: str = "OAuthException"
    is_transient: bool | None = None
    user_title: str | None = None
    user_msg: str | None = None
    body: bytes | None = None
    content_type: str = "application/json; charset=UTF-8"
    fault: str | None = None  # "timeout" | "dropped" | "endless" | "slow" | "huge"
    job_outcome: str | None = None  # "failed" | "skipped" | "stuck"
    throttled: bool = False


TOKEN_MESSAGES = {
    None: "Invalid OAuth access token - Cannot parse access token",
    458: "Error validating access token: The user has not authorized application 1000000001.",
    459: "Error validating access token: You cannot access the app till you log in to "
    "www.facebook.com and follow the instructions given.",
    460: "Error validating access token: The session has been invalidated because the user "
    "changed their password or Facebook has changed the session for security reasons.",
    463: "Error validating access token: Session has expired on Sunday, 01-Nov-26 09:00:00 PST.",
    464: "Error validating access token: Sessions for the user are not allowed because the "
    "user is not a confirmed user.",
    467: "Error validating access token: The session is invalid because the user logged out.",
    492: "Error validating access token: The session is invalid.",
}
THROTTLE_MESSAGES = {
    4: "(#4) Application request limit reached",
    17: "(#17) User request limit reached",
    32: "(#32) Page request limit reached",
    613: "(#613) Calls to this api have exceeded the rate limit.",
}
THROTTLE_ACCOUNT_MESSAGE = (
    "There have been too many calls from this ad-account. Wait a bit and try again."
)
TOO_MUCH_DATA_MESSAGE = (
    "Please reduce the amount of data you're asking for, then retry your request"
)
HTML_502 = (
    b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>"
    b"<body><h1>Bad Gateway</h1><p>The server returned an invalid response.</p></body></html>"
)


def _failure_catalog() -> dict[str, FailureSpec]:
    catalog = {**_graph_errors(), **_broken_answers()}
    catalog["permission_200"] = catalog["permission"]
    catalog.update(_token_failures())
    catalog.update(_throttles())
    catalog["throttled"] = catalog["throttled_80000"]
    return catalog


def _graph_errors() -> dict[str, FailureSpec]:
    """Meta's own error answers, as its JSON `error` object says them."""
    return {
        "token": FailureSpec(code=190, message=TOKEN_MESSAGES[None]),
        "permission": FailureSpec(
            status=403, code=200,
            message="(#200) Ad account owner has NOT grant ads_management or ads_read permission",
        ),
        "permission_10": FailureSpec(
            status=403, code=10,
            message="(#10) Application does not have permission for this action",
        ),
        "too_much_data": FailureSpec(status=500, code=1, message=TOO_MUCH_DATA_MESSAGE),
        "too_much_data_1504018": FailureSpec(
            code=100, subcode=1504018, message="Invalid parameter",
            user_title="Request Timed Out",
            user_msg="Your request timed out. Please use a smaller date range or an async job.",
        ),
        "too_much_data_1504038": FailureSpec(
            code=2, subcode=1504038, is_transient=True,
            message="An unexpected error has occurred. Please retry your request later.",
            user_title="Request Timed Out",
            user_msg="Your request timed out. Please use a smaller date range or an async job.",
        ),
        "unknown_error": FailureSpec(
            status=500, code=1, subcode=99, message="An unknown error occurred"
        ),
        "transient": FailureSpec(
            code=2, is_transient=True,
            message="An unexpected error has occurred. Please retry your request later.",
        ),
        "other": FailureSpec(code=100, message="(#100) Invalid parameter"),
    }


def _broken_answers() -> dict[str, FailureSpec]:
    """Answers that are no Graph answer (HTML, cut JSON, dropped connections) and async
    reports that never finish."""
    return {
        "http5xx_html": FailureSpec(
            status=502, body=HTML_502, content_type="text/html; charset=utf-8"
        ),
        "http5xx_empty": FailureSpec(status=503, body=b"", content_type="text/html"),
        "html_page": FailureSpec(
            status=200, body=b"<html><body>Sorry, something went wrong.</body></html>",
            content_type="text/html; charset=utf-8",
        ),
        "malformed_json": FailureSpec(status=200, body=b'{"data": [{"ad_id": "1", "spe'),
        "wrong_shape": FailureSpec(status=200, body=b'["not", "an", "object"]'),
        "not_found": FailureSpec(status=404, body=b"Not Found", content_type="text/plain"),
        "timeout": FailureSpec(fault="timeout"),
        "dropped": FailureSpec(fault="dropped"),
        # The real answer, but a listing whose every page announces another,
        "endless_paging": FailureSpec(fault="endless"),
        # sent a byte at a time (`slow_body_byte_seconds` apart),
        "slow_body": FailureSpec(fault="slow"),
        # or a body of `huge_body_bytes` without a length, JSON of mostly blanks.
        "huge_body": FailureSpec(fault="huge"),
        "job_failed": FailureSpec(job_outcome="failed"),
        "job_skipped": FailureSpec(job_outcome="skipped"),
        "job_stuck": FailureSpec(job_outcome="stuck"),
    }


def _token_failures() -> dict[str, FailureSpec]:
    return {
        f"token_{subcode}": FailureSpec(code=190, subcode=subcode, message=TOKEN_MESSAGES[subcode])
        for subcode in TOKEN_SUBCODES
    }


def _throttles() -> dict[str, FailureSpec]:
    """Each throttle code as Meta answers it, and the subcoded ones naming which limit:
    `throttled_4_1504022` the app's insights load, `throttled_4_1504039` the account's,
    `throttled_613_1487742` the account's score at Development tier (`throttled_613`, without
    a subcode, is abuse prevention)."""
    throttles = {
        f"throttled_{code}": FailureSpec(
            code=code,
            subcode=2446079 if code == 17 or code >= 80000 else None,
            message=THROTTLE_MESSAGES.get(code, THROTTLE_ACCOUNT_MESSAGE),
            throttled=True,
        )
        for code in THROTTLE_CODES
    }
    for code, subcode in ((4, 1504022), (4, 1504039), (613, 1487742)):
        throttles[f"throttled_{code}_{subcode}"] = FailureSpec(
            code=code, subcode=subcode, throttled=True,
            message=THROTTLE_ACCOUNT_MESSAGE if code == 613 else THROTTLE_MESSAGES[code],
        )
    return throttles


FAILURES = _failure_catalog()
# Answers without end (or at a byte a second) are staged where a person waits on them (the
# account listings and reads of `rastro accounts` and `link`), not mid-sync.
UNBOUNDED_FAULTS = frozenset({"endless", "slow", "huge"})
ACCOUNT_POINTS = frozenset({"adaccounts", "owned_ad_accounts", "client_ad_accounts", "account",
                            "me"})
FAILURE_POINTS = frozenset(
    {"insights", "insights_page", "async", "report", "report_insights", "ads", "ads_by_id",
     "account", "me", "adaccounts", "owned_ad_accounts", "client_ad_accounts", "thumbnail"}
)


@dataclass(slots=True)
class Failure:
    point: str
    error: str
    remaining: int | None  # None: until cleared
    account: str | None
    regain_minutes: int
    skip: int = 0  # matching requests still let through before the first failure


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake answered, as `FakeWorld.record_requests()` keeps them."""

    endpoint: str
    account: str | None
    token: str | None  # the credential it carried (Authorization or access_token), if any


@dataclass(slots=True)
class ReportJob:
    run_id: str
    ad_account_id: str
    token: str
    since: date
    until: date
    fields: tuple[str, ...]
    statuses: frozenset[str]
    outcome: str  # "complete" | "failed" | "skipped" | "stuck"
    polls: int = 0
    started: float = 0.0  # the world's monotonic reading when the job was made
    duration_seconds: float = 0.0  # how long it runs before it can complete
    rows: list[tuple[FakeAd, date, Figures]] | None = None


class MutableClock:
    """A clock tests move by hand: `clock.set(...)`, `clock.advance(hours=2)`."""

    def __init__(self, instant: datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("a clock needs an aware datetime")
        self.instant = instant

    def __call__(self) -> datetime:
        return self.instant

    def set(self, instant: datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("a clock needs an aware datetime")
        self.instant = instant

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> None:
        self.instant = self.instant + (delta or timedelta()) + timedelta(**kwargs)


def normalize_account(ad_account_id: str) -> str:
    text = str(ad_account_id).strip()
    digits = text.removeprefix("act_")
    if not digits.isdigit():
        raise ValueError(f"not an ad account id: {ad_account_id!r}")
    return f"act_{digits}"


def _by_number(ad_account_ids: Iterable[str]) -> list[str]:
    return sorted(ad_account_ids, key=lambda act: int(act.removeprefix("act_")))


def months_before(day: date, months: int) -> date:
    month_index = day.year * 12 + (day.month - 1) - months
    year, month = divmod(month_index, 12)
    month += 1
    for last in (31, 30, 29, 28):
        try:
            return date(year, month, min(day.day, last))
        except ValueError:
            continue
    raise AssertionError("unreachable")


def quantize_spend(amount: Decimal, currency: str) -> Decimal:
    step = Decimal(1) if currency.upper() in ZERO_DECIMAL_CURRENCIES else Decimal("0.01")
    return amount.quantize(step, rounding=ROUND_HALF_UP)


class FakeWorld:
    """The state behind the fake Graph. Thread-safe through `lock`.

    Args:
        clock: the world's now (settable later: `world.clock = ...`).
        seed: changes every figure, deterministically.
        row_cap: rows a synchronous insights request may produce before Meta
            answers "Please reduce the amount of data".
        limits: which of Meta's rate limits hold, and how large (settable later:
            `world.limits = LimitModel(...)`; what was spent stays in `ledger`).
    """

    def __init__(self, clock: Clock = system_clock, seed: int = 0,
                 row_cap: int = DEFAULT_ROW_CAP, limits: LimitModel | None = None) -> None:
        self.clock = clock
        self.limits = limits or LimitModel()
        self.ledger = LimitLedger()
        self.seed = seed
        self.row_cap = row_cap
        self.max_page_size = MAX_PAGE_SIZE
        self.server_stall_seconds = SERVER_STALL_SECONDS
        self.slow_body_byte_seconds = SLOW_BODY_BYTE_SECONDS
        self.huge_body_bytes = HUGE_BODY_BYTES
        # Real Meta answers a page in 0.3-2 s and an async report in seconds to minutes.
        # Benchmarks set these; at zero (the default) the fake answers at once.
        self.request_delay_seconds = 0.0
        self.async_report_seconds = 0.0
        self.sleep: Callable[[float], None] = time.sleep
        self.monotonic: Callable[[], float] = time.monotonic
        self.accounts: dict[str, FakeAccount] = {}
        self.calls: Counter[str] = Counter()
        self.lock = threading.RLock()
        self._grants: dict[str, set[str]] = {}
        self._client_accounts: dict[str, set[str]] = {}
        self._dead_tokens: dict[str, int | None] = {}
        self._overrides: dict[tuple[str, str, date], Figures | None] = {}
        self._failures: list[Failure] = []
        self._jobs: dict[str, ReportJob] = {}
        self._trace_counter = 0
        self.requests: list[RecordedRequest] | None = None
        # Accounts over their own insights limit until taken away, with the regain minutes
        # Meta announces; and whether every Graph answer is Meta's "please retry later".
        self._throttled: dict[str, int] = {}
        self.overloaded = False

    # -- building -----------------------------------------------------------

    @classmethod
    def demo(cls, clock: Clock = system_clock) -> FakeWorld:
        """Eight accounts in eight timezones and currencies, every one read by `DEMO_TOKEN`:
        the three `rastro demo` links (`act_1001` to `act_1003`), and `DEMO_UNLINKED`, which
        `rastro accounts` lists and `rastro link --all` links."""
        world = cls(clock, seed=DEMO_SEED)
        first_day = date(2026, 1, 1)
        world.add_account("act_1001", timezone="America/Sao_Paulo", currency="BRL",
                          name="Loja Aurora", n_ads=20, first_day=first_day)
        world.add_account("act_1002", timezone="Asia/Tokyo", currency="JPY",
                          name="東京ストア", n_ads=20, first_day=first_day)
        world.add_account("act_1003", timezone="America/Los_Angeles", currency="USD",
                          name="Pacific Goods", n_ads=20, first_day=first_day)
        # Each account's figures depend on its own id only: the first three stay as they were.
        for act, (timezone, currency, name) in DEMO_UNLINKED.items():
            world.add_account(act, timezone=timezone, currency=currency, name=name, n_ads=20,
                              first_day=first_day)
        return world

    def add_account(
        self,
        ad_account_id: str,
        *,
        timezone: str,
        currency: str,
        name: str | None = None,
        n_ads: int = 20,
        token: str | Iterable[str] | None = DEMO_TOKEN,
        account_status: int = 1,
        first_day: date | None = None,
    ) -> FakeAccount:
        """Add an account with `n_ads` generated ads, readable by `token`.

        `first_day` is the first day any ad delivers; None means delivery as
        far back as Meta keeps insights (37 months before the world's now).
        """
        act = normalize_account(ad_account_id)
        zone(timezone)
        if not 0 <= n_ads <= MAX_ADS_PER_ACCOUNT:
            raise ValueError(f"n_ads must be within 0..{MAX_ADS_PER_ACCOUNT}")
        with self.lock:
            if act in self.accounts:
                raise ValueError(f"{act} already exists")
            digits = act.removeprefix("act_")
            account = FakeAccount(
                ad_account_id=act,
                name=name or f"Fake account {digits}",
                timezone=timezone,
                currency=currency.upper(),
                account_status=account_status,
                first_day=first_day,
                business_id=str(100000000 + self.hash_int(act, "business") % 900000000),
            )
            self.accounts[act] = account
            for index in range(n_ads):
                self._generate_ad(account, index)
            tokens = [token] if isinstance(token, str) else list(token or [])
            for one in tokens:
                self.grant(one, act)
            return account

    def _generate_ad(self, account: FakeAccount, index: int) -> FakeAd:
        digits = account.ad_account_id.removeprefix("act_")
        words = AD_NAME_WORDS.get(account.currency, DEFAULT_AD_NAME_WORDS)
        campaign_index = index // 7
        adset_index = index // 4
        status = STATUS_CYCLE[index % len(STATUS_CYCLE)]
        ad = FakeAd(
            ad_id=f"12021{digits}{index:04d}",
            ad_account_id=account.ad_account_id,
            name=f"{words[index % len(words)]} #{index + 1}",
            adset_id=f"12022{digits}{adset_index:04d}",
            adset_name=f"{words[adset_index % len(words)]} · conjunto {adset_index + 1}"
            if account.currency == "BRL" else f"Ad set {adset_index + 1}",
            campaign_id=f"12023{digits}{campaign_index:04d}",
            campaign_name=f"{words[campaign_index % len(words)]} — campaign {campaign_index + 1}",
            effective_status=status,
            creative_kind=CREATIVE_KINDS[index % len(CREATIVE_KINDS)],
        )
        if status in STOPPED_STATUSES:
            anchor = account.first_day or STOP_ANCHOR_DAY
            ad.delivers_until = anchor + timedelta(
                days=20 + self.hash_int(account.ad_account_id, ad.ad_id, "stop") % 90
            )
        account.ads[ad.ad_id] = ad
        return ad

    def add_ad(
        self,
        ad_account_id: str,
        *,
        name: str | None = None,
        effective_status: str = "ACTIVE",
        creative_kind: str = "image",
        delivers_from: date | None = None,
    ) -> FakeAd:
        """A new ad in an existing account; returns it (its id is `ad.ad_id`)."""
        with self.lock:
            account = self._account(ad_account_id)
            ad = self._generate_ad(account, len(account.ads))
            ad.effective_status = self._status(effective_status)
            ad.creative_kind = self._kind(creative_kind)
            ad.delivers_until = None
            ad.delivers_from = delivers_from
            if name is not None:
                ad.name = name
            return ad

    def set_ad(
        self,
        ad_id: str,
        *,
        name: str | None = None,
        effective_status: str | None = None,
        creative_kind: str | None = None,
        new_creative: bool = False,
        adset_name: str | None = None,
        campaign_name: str | None = None,
        delivers_until: date | None = None,
    ) -> FakeAd:
        """Change an ad. A new creative (or kind) gets a new id, URL and image."""
        with self.lock:
            ad = self.ad(ad_id)
            if name is not None:
                ad.name = name
            if adset_name is not None:
                ad.adset_name = adset_name
            if campaign_name is not None:
                ad.campaign_name = campaign_name
            if effective_status is not None:
                ad.effective_status = self._status(effective_status)
            if delivers_until is not None:
                ad.delivers_until = delivers_until
            if creative_kind is not None:
                ad.creative_kind = self._kind(creative_kind)
                new_creative = True
            if new_creative:
                ad.creative_version += 1
            return ad

    def rename_ad(self, ad_id: str, name: str) -> FakeAd:
        return self.set_ad(ad_id, name=name)

    def ad(self, ad_id: str) -> FakeAd:
        with self.lock:
            for account in self.accounts.values():
                if ad_id in account.ads:
                    return account.ads[ad_id]
        raise KeyError(f"no ad {ad_id}")

    def set_ad_day(
        self, ad_account_id: str, ad_id: str, day: date,
        figures: Figures | Mapping[str, Any] | None,
    ) -> None:
        """Pin an ad-day's figures (None: no delivery), overriding the generator."""
        with self.lock:
            account = self._account(ad_account_id)
            if ad_id not in account.ads:
                raise KeyError(f"{account.ad_account_id} has no ad {ad_id}")
            if figures is not None and not isinstance(figures, Figures):
                values = dict(figures)
                values["spend"] = Decimal(str(values["spend"]))
                figures = Figures(**values)
            self._overrides[(account.ad_account_id, ad_id, day)] = figures

    # -- tokens ---------------------------------------------------------------

    def add_token(self, token: str) -> None:
        """A valid token that reads nothing yet."""
        with self.lock:
            self._grants.setdefault(token, set())

    def grant(self, token: str, ad_account_id: str) -> None:
        with self.lock:
            self._grants.setdefault(token, set()).add(normalize_account(ad_account_id))

    def revoke(self, token: str, ad_account_id: str) -> None:
        with self.lock:
            self._grants.get(token, set()).discard(normalize_account(ad_account_id))

    def kill_token(self, token: str, subcode: int | None = 463) -> None:
        """From now on the token answers 190 with `subcode` (None: no subcode)."""
        with self.lock:
            self._dead_tokens[token] = subcode

    def revive_token(self, token: str) -> None:
        with self.lock:
            self._dead_tokens.pop(token, None)

    def token_state(self, token: str | None) -> tuple[str, int | None]:
        """("missing" | "unknown" | "dead" | "ok", subcode)."""
        if not token:
            return "missing", None
        if token in self._dead_tokens:
            return "dead", self._dead_tokens[token]
        if token not in self._grants:
            return "unknown", None
        return "ok", None

    def can_read(self, token: str, ad_account_id: str) -> bool:
        return ad_account_id in self._grants.get(token, set())

    def reachable(self, token: str) -> list[FakeAccount]:
        """The accounts `token` reads, as `/me/adaccounts` lists them (by id, numerically)."""
        with self.lock:
            granted = self._grants.get(token, set())
            return [self.accounts[act] for act in _by_number(granted) if act in self.accounts]

    # -- businesses -------------------------------------------------------------

    def add_client_account(self, business_id: str, ad_account_id: str) -> None:
        """`business_id` manages `ad_account_id` for its owner (an agency and its client)."""
        with self.lock:
            act = self._account(ad_account_id).ad_account_id
            self._client_accounts.setdefault(str(business_id), set()).add(act)

    def is_business(self, business_id: str) -> bool:
        with self.lock:
            return business_id in self._client_accounts or any(
                account.business_id == business_id for account in self.accounts.values()
            )

    def owned_accounts(self, business_id: str) -> list[FakeAccount]:
        with self.lock:
            owned = [act for act, account in self.accounts.items()
                     if account.business_id == business_id]
            return [self.accounts[act] for act in _by_number(owned)]

    def client_accounts(self, business_id: str) -> list[FakeAccount]:
        with self.lock:
            managed = self._client_accounts.get(business_id, set())
            return [self.accounts[act] for act in _by_number(managed)]

    # -- lasting trouble ---------------------------------------------------------

    def throttle_account(self, ad_account_id: str, regain_minutes: int) -> None:
        """Until `end_throttle`, the account's insights calls are over its own `ads_insights`
        limit: 80000 / 2446079, Meta announcing access back in `regain_minutes`."""
        if regain_minutes < 1:
            raise ValueError("regain_minutes must be at least 1")
        with self.lock:
            self._throttled[self._account(ad_account_id).ad_account_id] = regain_minutes

    def end_throttle(self, ad_account_id: str) -> None:
        with self.lock:
            self._throttled.pop(normalize_account(ad_account_id), None)

    def throttled_for(self, ad_account_id: str | None) -> int | None:
        """The regain minutes of the account's lasting throttle; None when it has none."""
        return self._throttled.get(ad_account_id) if ad_account_id else None

    # -- failures -------------------------------------------------------------

    def fail(
        self,
        point: str,
        error: str,
        times: int | None = 1,
        account: str | None = None,
        *,
        regain_minutes: int = DEFAULT_REGAIN_MINUTES,
        skip: int = 0,
    ) -> None:
        """Make the next `times` requests at `point` fail with `error`.

        Points: insights (a synchronous read's first page), insights_page (a
        later page), async (creating a report job; `job_failed`,
        `job_skipped`, `job_stuck` decide how the job ends instead), report,
        report_insights, ads, ads_by_id, account, me, adaccounts (any page of
        `/me/adaccounts`), owned_ad_accounts, client_ad_accounts, thumbnail. Errors: the
        keys of `FAILURES` (`endless_paging`, `slow_body` and `huge_body` at the account
        points only). `times=None` fails until `clear_failures()`.
        `skip` lets that many matching requests through first, so a failure
        can land in the middle of a sync.
        """
        if point not in FAILURE_POINTS:
            raise ValueError(f"unknown failure point {point!r}")
        if error not in FAILURES:
            raise ValueError(f"unknown failure {error!r}")
        if FAILURES[error].job_outcome and point != "async":
            raise ValueError(f"{error} only applies to point 'async'")
        if FAILURES[error].fault in UNBOUNDED_FAULTS and point not in ACCOUNT_POINTS:
            raise ValueError(f"{error} only applies to the account points {sorted(ACCOUNT_POINTS)}")
        if skip < 0:
            raise ValueError("skip must be >= 0")
        with self.lock:
            self._failures.append(Failure(
                point, error, times, normalize_account(account) if account else None,
                regain_minutes, skip,
            ))

    def clear_failures(self) -> None:
        with self.lock:
            self._failures.clear()

    def take_failure(self, point: str, account: str | None) -> Failure | None:
        """The switch a request at `point` trips, consuming one use."""
        for failure in self._failures:
            if failure.point != point or (failure.account and failure.account != account):
                continue
            if failure.skip > 0:
                failure.skip -= 1
                continue
            if failure.remaining is not None:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self._failures.remove(failure)
            return failure
        return None

    # -- truth ------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock()

    def today(self, ad_account_id: str) -> date:
        """The account-local date at the world's now."""
        account = self._account(ad_account_id)
        return local_date(self.clock(), account.timezone)

    def truth(self, ad_account_id: str, day: date) -> list[InsightRow]:
        """Exactly what a complete read of `day` (every status) answers now."""
        with self.lock:
            account = self._account(ad_account_id)
            rows = self.rows(account, day, day, frozenset(EFFECTIVE_STATUSES))
            return [
                InsightRow(
                    ad_id=ad.ad_id, day=when, spend=fig.spend, impressions=fig.impressions,
                    clicks=fig.clicks, conversations=fig.conversations, ad_name=ad.name,
                    adset_id=ad.adset_id, adset_name=ad.adset_name,
                    campaign_id=ad.campaign_id, campaign_name=ad.campaign_name,
                )
                for ad, when, fig in rows
            ]

    def rows(
        self, account: FakeAccount, since: date, until: date, statuses: frozenset[str]
    ) -> list[tuple[FakeAd, date, Figures]]:
        """Every delivering ad-day of the range, by day then ad id."""
        now = self.clock()
        today = local_date(now, account.timezone)
        out: list[tuple[FakeAd, date, Figures]] = []
        ads = [ad for _, ad in sorted(account.ads.items()) if ad.effective_status in statuses]
        day = since
        while day <= min(until, today):
            for ad in ads:
                figures = self.figures(account, ad, day, now)
                if figures is not None:
                    out.append((ad, day, figures))
            day += timedelta(days=1)
        return out

    def figures(self, account: FakeAccount, ad: FakeAd, day: date,
                now: datetime | None = None) -> Figures | None:
        """One ad-day as Meta reports it at `now` (None: absent from the answer)."""
        now = now or self.clock()
        today = local_date(now, account.timezone)
        if day > today:
            return None
        key = (account.ad_account_id, ad.ad_id, day)
        if key in self._overrides:
            return self._overrides[key]
        if day < months_before(today, RETENTION_MONTHS):
            return None
        start = ad.delivers_from or account.first_day
        if (start and day < start) or (ad.delivers_until and day > ad.delivers_until):
            return None
        act, ad_id, iso = account.ad_account_id, ad.ad_id, day.isoformat()
        if self._unit(act, ad_id, iso, "delivers") >= DELIVERY_SHARE:
            return None
        age = (today - day).days
        if self._unit(act, ad_id, iso, "vanish") < VANISH_SHARE:
            vanish_age = 1 + int(self._unit(act, ad_id, iso, "vanish_age") * SETTLE_DAYS)
            if age >= vanish_age:
                return None
        factor = self._settle_factor(account, ad, day, age, now)

        scale_usd = 3 + 40 * self._unit(act, ad_id, "scale")
        spend_usd = scale_usd * (0.4 + 1.2 * self._unit(act, ad_id, iso, "spend"))
        cpm_usd = 4 + 10 * self._unit(act, ad_id, "cpm")
        ctr = 0.005 + 0.03 * self._unit(act, ad_id, "ctr")
        impressions_final = int(spend_usd / cpm_usd * 1000)
        clicks_final = int(impressions_final * ctr)
        messaging = self._unit(act, ad_id, "messaging") < 0.5
        conversations_final = (
            int(clicks_final * (0.05 + 0.3 * self._unit(act, ad_id, iso, "conv")))
            if messaging else 0
        )
        rate = UNITS_PER_USD.get(account.currency, 1.0)
        spend = quantize_spend(Decimal(repr(spend_usd * rate * factor)), account.currency)
        impressions = int(impressions_final * factor)
        if impressions == 0 and spend == 0:
            return None
        return Figures(
            spend=spend,
            impressions=impressions,
            clicks=int(clicks_final * factor),
            conversations=int(conversations_final * factor),
        )

    def _settle_factor(self, account: FakeAccount, ad: FakeAd, day: date, age: int,
                       now: datetime) -> float:
        if age == 0:
            start = local_midnight(day, account.timezone)
            end = local_midnight(day + timedelta(days=1), account.timezone)
            elapsed = (now - start) / (end - start)
            return TODAY_SHARE_OF_FINAL * min(1.0, max(0.0, elapsed))
        if age > SETTLE_DAYS:
            return 1.0
        wobble = 0.5 + self._unit(account.ad_account_id, ad.ad_id, day.isoformat(), "settle", age)
        return 1.0 - SETTLE_SWING * (SETTLE_DAYS + 1 - age) / SETTLE_DAYS * wobble

    # -- thumbnails -------------------------------------------------------------

    def thumbnail_bytes(self, ad_id: str, width: int = THUMBNAIL_SIZE_PX,
                        height: int = THUMBNAIL_SIZE_PX) -> bytes:
        """The PNG the CDN serves for the ad's current creative."""
        with self.lock:
            ad = self.ad(ad_id)
            return self.creative_png(ad.ad_id, ad.creative_id, width, height)

    def creative_png(self, ad_id: str, creative_id: str, width: int, height: int) -> bytes:
        top = self._colour(ad_id, creative_id, "top")
        bottom = self._colour(ad_id, creative_id, "bottom")
        return png(width, height, top, bottom)

    def creative_colours(self, ad_id: str, creative_id: str) -> list[list[tuple[int, int, int]]]:
        return [[self._colour(ad_id, creative_id, r, c) for c in range(2)] for r in range(2)]

    def has_thumbnail(self, ad: FakeAd) -> bool:
        if ad.creative_kind != "other":
            return True
        return self._unit(ad.ad_id, ad.creative_id, "has_thumbnail") < 0.5

    def sign(self, path: str, exp: int) -> str:
        digest = hashlib.blake2b(
            f"{path}|{exp}".encode(), key=f"fake-cdn-{self.seed}".encode(), digest_size=12
        )
        return digest.hexdigest()

    # -- usage and bookkeeping --------------------------------------------------

    def record_requests(self) -> list[RecordedRequest]:
        """Start keeping every request (endpoint, account, credential); the list kept."""
        with self.lock:
            if self.requests is None:
                self.requests = []
            return self.requests

    def record_call(self, endpoint: str, account: str | None, *,
                    token: str | None = None, graph: bool = True) -> None:
        """Count one request (a thumbnail's CDN fetch, `graph=False`, is no Graph call: what
        Meta's rate limits count is spent by the answer, through `ledger`)."""
        self.calls[endpoint] += 1
        if self.requests is not None:
            self.requests.append(RecordedRequest(endpoint, account, token))

    def active_ads(self, ad_account_id: str) -> int:
        """The account's ads delivering now: what its business-use-case buckets grow by."""
        account = self._account(ad_account_id)
        return sum(1 for ad in account.ads.values() if ad.effective_status == "ACTIVE")

    def use_up(self, ad_account_id: str, limit: str, calls: int) -> None:
        """Spend `calls` of the account's `ads_insights` or `ads_management` bucket now, as
        calls made elsewhere (by another app, or before the test began)."""
        kinds = {"ads_insights": INSIGHTS, "ads_management": MANAGEMENT}
        if limit not in kinds:
            raise ValueError(f"limit must be one of {sorted(kinds)}")
        with self.lock:
            act = self._account(ad_account_id).ad_account_id
            self.ledger.use(act, kinds[limit], calls, self.monotonic())

    def business_id(self, account: str) -> str:
        return self.accounts[account].business_id

    def next_trace_id(self) -> str:
        self._trace_counter += 1
        digest = hashlib.blake2b(f"{self.seed}|{self._trace_counter}".encode(), digest_size=12)
        return "A" + digest.hexdigest()[:22]

    def new_job(self, **kwargs: Any) -> ReportJob:
        run_id = str(6120000000000000 + len(self._jobs) + 1)
        job = ReportJob(run_id=run_id, started=self.monotonic(),
                        duration_seconds=self.async_report_seconds, **kwargs)
        self._jobs[run_id] = job
        return job

    def job(self, run_id: str) -> ReportJob | None:
        return self._jobs.get(run_id)

    # -- helpers ------------------------------------------------------------------

    def _account(self, ad_account_id: str) -> FakeAccount:
        act = normalize_account(ad_account_id)
        if act not in self.accounts:
            raise KeyError(f"no account {act}")
        return self.accounts[act]

    @staticmethod
    def _status(status: str) -> str:
        if status not in EFFECTIVE_STATUSES:
            raise ValueError(f"unknown effective_status {status!r}")
        return status

    @staticmethod
    def _kind(kind: str) -> str:
        if kind not in CREATIVE_KINDS:
            raise ValueError(f"creative kind must be one of {CREATIVE_KINDS}")
        return kind

    def hash_int(self, *parts: object) -> int:
        text = "|".join([str(self.seed), *map(str, parts)])
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")

    def _unit(self, *parts: object) -> float:
        """A uniform number in [0, 1) fixed by `parts` and the seed."""
        return self.hash_int(*parts) / 2**64

    def _colour(self, *parts: object) -> tuple[int, int, int]:
        value = self.hash_int("colour", *parts)
        return (value & 0xFF, (value >> 8) & 0xFF, (value >> 16) & 0xFF)
