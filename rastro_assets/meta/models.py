"""Typed values the Meta client returns. Money is `Decimal`, never float."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

CreativeType = str  # 'video' | 'image' | 'carousel' | 'other'


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
    """The highest share of any Meta rate limit seen, and when access returns.

    `pct` is the maximum over every percentage in the four usage headers;
    `regain_seconds` the longest time to regain access announced (None: none).
    """

    pct: float = 0.0
    regain_seconds: int | None = None

    def merge(self, other: Usage) -> Usage:
        regain = max(self.regain_seconds or 0, other.regain_seconds or 0)
        return Usage(pct=max(self.pct, other.pct), regain_seconds=regain or None)


@dataclass(frozen=True, slots=True)
class InsightsChunk:
    """Rows for a run of days read together.

    `complete` is True when Meta's whole answer for every day in
    [since, until] was read (all pages, no truncation): a complete day's
    missing ad-days may be deleted. When False, the rows are what could be
    read and nothing may be inferred from what is absent.
    """

    since: date
    until: date
    rows: list[InsightRow]
    complete: bool


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


@dataclass(frozen=True, slots=True)
class AdAccount:
    ad_account_id: str  # act_<digits>
    name: str | None
    currency: str
    timezone: str  # IANA, from timezone_name
    account_status: int | None = None


@dataclass(frozen=True, slots=True)
class Thumbnail:
    content_type: str
    data: bytes
