"""What a sync is asked to do and what came of it, spend and catalog alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import date, datetime
from decimal import Decimal

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind
from rastro_assets.meta.models import Usage
from rastro_assets.outcomes import Outcome, SyncKind, error_line
from rastro_assets.timekeeping import Clock, days_between
from rastro_assets.vault import Vault
from rastro_assets.warehouse.ad_spend_table import DaySummary
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.thumbnails import StoredThumbnail

OUTCOME_OF_ERROR_KIND: dict[ErrorKind, Outcome] = {
    ErrorKind.TOKEN: Outcome.TOKEN,
    ErrorKind.THROTTLED: Outcome.THROTTLED,
    ErrorKind.PERMISSION: Outcome.PERMISSION,
}
"""The outcome a Meta failure ends a sync with; any other kind is `Outcome.OTHER`."""


def outcome_of(kind: ErrorKind) -> Outcome:
    return OUTCOME_OF_ERROR_KIND.get(kind, Outcome.OTHER)


@dataclass(frozen=True)
class Failure:
    """How a step ended the sync it failed: the outcome and the contract's error line."""

    outcome: Outcome
    error: str
    regain_at: datetime | None = None  # when Meta lets the account be read again, if it said
    rate_limit: str | None = None  # the Meta limit (`meta.limits.RateLimit`) that refused it

    @classmethod
    def of(
        cls,
        outcome: Outcome,
        message: str,
        *,
        regain_at: datetime | None = None,
        rate_limit: str | None = None,
    ) -> Failure:
        return cls(outcome, error_line(outcome, message), regain_at, rate_limit)


ClientFactory = Callable[[str], MetaClient]
"""Makes a Meta client from a token: the real Graph API, or the fake one in tests."""


@dataclass
class Wiring:
    """What every sync works with: the warehouse, a way to Meta, the vault and the clock."""

    warehouse: Warehouse
    client_factory: ClientFactory
    _: KW_ONLY
    clock: Clock
    vault_factory: Callable[[], Vault] = Vault.from_env


class SyncRefused(ValueError):
    """The request itself is wrong (unknown account, a date past local today)."""


class CatalogRefused(ValueError):
    """The request itself is wrong: the account is not linked to any site."""


@dataclass(frozen=True)
class SyncRequest:
    ad_account_id: str
    since: date
    until: date
    kind: str = SyncKind.MANUAL
    run_id: str = "manual"
    catalog: bool = False


@dataclass
class CatalogOutcome:
    """How one catalog read ended. `error` is the contract's "CODE: message"."""

    ad_account_id: str
    full: bool
    outcome: Outcome = Outcome.OK
    error: str | None = None
    ads_read: int = 0  # ads Meta answered with
    added: int = 0
    renamed: int = 0
    status_changed: int = 0
    skipped: int = 0  # filed under another account: left alone
    asked_by_id: int = 0  # unnamed ads asked for by id (not full)
    named_ids: list[str] = field(default_factory=list)  # the ads the by-id answer covered
    total_ads: int = 0  # the account's catalog after a read that wrote (else not counted)
    api_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    regain_seconds: int | None = None  # the wait a throttled read was told (or last saw)
    rate_limit: str | None = None  # the Meta limit (`meta.limits.RateLimit`) that refused it

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK


Preview = StoredThumbnail
"""A small stored picture, shown in the run's metadata."""


@dataclass
class ThumbnailOutcome:
    """How one thumbnail pass ended. Single images failing leave `outcome` ok."""

    ad_account_id: str
    outcome: Outcome = Outcome.OK
    error: str | None = None
    wanted: int = 0  # missing or stale pictures tried this run (capped)
    fetched: int = 0  # stored
    failed: int = 0  # left untouched, retried next run
    removed: int = 0  # pictures of a replaced creative that has none
    failures: list[str] = field(default_factory=list)  # the first few reasons, URLs cut
    preview: list[Preview] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK


@dataclass
class SyncOutcome:
    """How one account sync ended. `error` is the contract's "CODE: message"."""

    request: SyncRequest
    timezone: str = "UTC"
    currency: str | None = None  # the account's, as linked: the unit of every spend figure
    started_at: datetime | None = None
    outcome: Outcome = Outcome.OK
    error: str | None = None
    rows_written: int = 0
    rows_deleted: int = 0
    api_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    regain_at: datetime | None = None
    rate_limit: str | None = None
    """The Meta limit (`meta.limits.RateLimit`) that held the account, when one did."""
    complete_days: list[date] = field(default_factory=list)
    incomplete_days: list[date] = field(default_factory=list)
    changed_days: list[date] = field(default_factory=list)
    """Days read in a part of the answer that inserted, changed or deleted a row."""
    days: dict[date, DaySummary] = field(default_factory=dict)
    # The catalog and thumbnails read after the spend. Their failure is
    # recorded here and never changes `outcome`: the spend was written.
    catalog: CatalogOutcome | None = None
    thumbnails: ThumbnailOutcome | None = None
    catalog_error: str | None = None
    token_rejected_by_meta: bool = False
    """Meta refused the token during this sync (not a run refused before reading)."""

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK

    @property
    def unread_days(self) -> list[date]:
        read = set(self.complete_days) | set(self.incomplete_days)
        return [
            day for day in days_between(self.request.since, self.request.until) if day not in read
        ]

    @property
    def spend_total(self) -> Decimal:
        return sum((summary.spend for summary in self.days.values()), Decimal(0))


@dataclass(frozen=True)
class WaveOutcome:
    outcomes: list[SyncOutcome]
    refused: list[tuple[SyncRequest, str]]  # never started: why
