"""Typed values the Meta client returns. Money is `Decimal` or `decimal128`, never float."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal, InvalidOperation
from operator import attrgetter

import pyarrow as pa

from rastro_assets.spend_schema import (
    COUNT_MAX,
    COUNT_TYPE,
    SPEND_LIMIT,
    SPEND_QUANTUM,
    SPEND_TYPE,
)

CreativeType = str  # 'video' | 'image' | 'carousel' | 'other'
# Every effective status an ad can have: the catalog and insights ask for all of them.
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


@dataclass(frozen=True, slots=True)
class InsightRow:
    """One ad-day of `level=ad, time_increment=1` insights."""

    ad_id: str
    day: date  # account-local date (date_start == date_stop)
    spend: Decimal  # major units, account currency, exactly as Meta's string
    impressions: int
    clicks: int
    conversations: int  # onsite_conversion.messaging_conversation_started_7d, 0 if absent
    ad_name: str | None = None
    adset_id: str | None = None
    adset_name: str | None = None
    campaign_id: str | None = None
    campaign_name: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """What Meta's usage headers said: the highest shares of its rate limits, and waits.

    `pct` is the maximum over every percentage in the four usage headers;
    `regain_seconds` the longest time to regain access announced (None: none).
    `account_pct` is the highest share of the account's own limits (its business use
    cases, its score, its own insights load) and `limit` names that limit
    (`meta.limits.RateLimit`); `app_pct` is the app's, every token together
    (`app_id_util_pct`, `X-App-Usage`). `reset_seconds` is `reset_time_duration`, when the
    account's score window frees again.
    """

    pct: float = 0.0
    regain_seconds: int | None = None
    account_pct: float = 0.0
    app_pct: float = 0.0
    limit: str | None = None
    reset_seconds: int | None = None

    def merge(self, other: Usage) -> Usage:
        regain = max(self.regain_seconds or 0, other.regain_seconds or 0)
        reset = max(self.reset_seconds or 0, other.reset_seconds or 0)
        nearest = other if other.account_pct > self.account_pct else self
        return Usage(
            pct=max(self.pct, other.pct),
            regain_seconds=regain or None,
            account_pct=nearest.account_pct,
            app_pct=max(self.app_pct, other.app_pct),
            limit=nearest.limit or self.limit or other.limit,
            reset_seconds=reset or None,
        )


# `InsightRow`'s fields as Arrow columns, in its order. The client leaves no
# null in the first six; a table built elsewhere is checked by its writer.
INSIGHT_SCHEMA = pa.schema(
    [
        ("ad_id", pa.string()),
        ("day", pa.date32()),
        ("spend", SPEND_TYPE),
        ("impressions", COUNT_TYPE),
        ("clicks", COUNT_TYPE),
        ("conversations", COUNT_TYPE),
        ("ad_name", pa.string()),
        ("adset_id", pa.string()),
        ("adset_name", pa.string()),
        ("campaign_id", pa.string()),
        ("campaign_name", pa.string()),
    ]
)


class UnrepresentableRow(ValueError):
    """An `InsightRow` holds a value its Arrow column cannot (a spend with 5 decimals, ...)."""


def insight_table(rows: Sequence[InsightRow]) -> pa.Table:
    """`rows` as an `INSIGHT_SCHEMA` table, exactly; UnrepresentableRow names the first misfit.

    None becomes null (the writers refuse a null figure with the row named).
    """
    try:
        return pa.table(
            [
                pa.array(list(map(attrgetter(column.name), rows)), column.type)
                for column in INSIGHT_SCHEMA
            ],
            schema=INSIGHT_SCHEMA,
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        problem = first_unrepresentable(rows) or f"the rows are malformed: {exc}"
        raise UnrepresentableRow(problem) from None


def first_unrepresentable(rows: Sequence[InsightRow]) -> str | None:
    """What is wrong with the first row whose ad id or figures do not fit the warehouse."""
    for row in rows:
        where = f"ad {row.ad_id} on {row.day}"
        if not isinstance(row.ad_id, str) or not row.ad_id:
            return f"an ad id on {row.day} is not a non-empty string: {row.ad_id!r}"
        spend = row.spend
        if isinstance(spend, bool) or not isinstance(spend, Decimal | int):
            return f"{where}: spend {spend!r} is not a Decimal"
        try:
            exact = Decimal(spend).quantize(SPEND_QUANTUM) == spend
        except InvalidOperation:
            exact = False
        if not exact:
            return f"{where}: spend {spend} has more than 4 decimal places or is not a number"
        if abs(spend) >= SPEND_LIMIT:
            return f"{where}: spend {spend} is too large for DECIMAL(18,4)"
        for figure in ("impressions", "clicks", "conversations"):
            value = getattr(row, figure)
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) > COUNT_MAX:
                return f"{where}: {figure} {value!r} is not a 64-bit integer"
    return None


@dataclass(frozen=True)
class InsightsChunk:
    """The ad-days of a run of days read together, as an `INSIGHT_SCHEMA` table.

    The client's tables hold one row per (day, ad_id), in that order.
    `complete` is True when Meta's whole answer for every day in
    [since, until] was read (all pages, no truncation): a complete day's
    missing ad-days may be deleted. When False, the rows are what could be
    read and nothing may be inferred from what is absent.
    """

    since: date
    until: date
    table: pa.Table
    complete: bool

    def __post_init__(self) -> None:
        if not isinstance(self.table, pa.Table):
            raise TypeError(
                "an insights chunk holds an Arrow table; build one from InsightRows with"
                " insight_table(rows)"
            )
        if not self.table.schema.equals(INSIGHT_SCHEMA):
            raise ValueError(
                f"an insights chunk needs INSIGHT_SCHEMA columns, not {self.table.schema}"
            )


@dataclass(slots=True)
class CallStats:
    """What a client spent: calls made and the peak usage seen."""

    api_calls: int = 0
    usage: Usage = field(default_factory=Usage)

    def record(self, usage: Usage) -> None:
        self.api_calls += 1
        self.usage = self.usage.merge(usage)


@dataclass(frozen=True, slots=True)
class Ad:
    """One ad of the catalog (`/act_x/ads` or `/?ids=`). None: Meta left it out."""

    ad_id: str
    ad_account_id: str | None = None
    name: str | None = None
    adset_id: str | None = None
    adset_name: str | None = None
    campaign_id: str | None = None
    campaign_name: str | None = None
    effective_status: str | None = None
    creative_type: CreativeType | None = None
    creative_id: str | None = None
    thumbnail_url: str | None = None


# Meta's numeric `account_status` and the name its documentation gives each.
ACCOUNT_STATUS_NAMES = {
    1: "ACTIVE",
    2: "DISABLED",
    3: "UNSETTLED",
    7: "PENDING_RISK_REVIEW",
    8: "PENDING_SETTLEMENT",
    9: "IN_GRACE_PERIOD",
    100: "PENDING_CLOSURE",
    101: "CLOSED",
}


@dataclass(frozen=True, slots=True)
class AdAccount:
    ad_account_id: str  # act_<digits>
    name: str | None
    currency: str
    timezone: str  # IANA, from timezone_name
    account_status: int | None = None

    @property
    def status_name(self) -> str | None:
        """`account_status` by its name; a number Meta documents no name for, as the number."""
        if self.account_status is None:
            return None
        return ACCOUNT_STATUS_NAMES.get(self.account_status, str(self.account_status))


@dataclass(frozen=True, slots=True)
class Thumbnail:
    content_type: str
    data: bytes
