"""What the planner knows of one linked ad account: its connection, sync runs and delivery."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

from rastro_assets.outcomes import Outcome

OK = Outcome.OK.value  # a plain str: compared with every run the planner reads


@dataclass(frozen=True, slots=True)
class SyncRun:
    """One `meta_sync_runs` row of an account."""

    run_id: str
    kind: str
    since: date | None
    until: date | None
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None = None
    catalog: bool = False
    usage_pct: float | None = None
    regain_at: datetime | None = None
    incomplete_days: tuple[date, ...] = ()
    # The Meta limit that held the account (`meta.limits.RateLimit`), and the account's own
    # peak share of its limits; None on rows written before either was recorded.
    rate_limit: str | None = None
    account_usage_pct: float | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the warehouse shows of an account's delivery, for the idle rule.

    `last_spend_day` is the latest account-local day with spend, or None when
    there is none as far back as the loader looked (at least the yesterday of
    any instant from the newest recorded sync on); `active_ad` is whether its
    catalog holds an ad whose effective status is ACTIVE.
    """

    last_spend_day: date | None = None
    active_ad: bool = False


@dataclass(frozen=True)
class AccountState:
    """What the planner knows of one linked ad account."""

    ad_account_id: str
    timezone: str
    linked_at: datetime
    connection_status: str
    connection_error: str | None
    token_sealed_at: datetime | None
    sync_requested_at: datetime | None
    runs: Sequence[SyncRun]
    # None: not known, so the account is read like one that delivers.
    delivery: Delivery | None = None
    # None when not known (or the connection row is missing): a paused account's
    # status then cannot say which connection the error it shows belongs to.
    connection_id: str | None = None
