"""One account-range sync: read Meta, write the warehouse, return an outcome.

Knows nothing of Dagster: the assets, the live waves, the benchmarks and the
tests all call `Syncer.sync` the same way. The token is opened from the
vault inside the sync and dropped with it; it never leaves this function.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.models import Usage
from rastro_assets.timekeeping import Clock, days_between, local_date
from rastro_assets.vault import SecretsKeyError, Vault
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.catalog import upsert_names_from_spend
from rastro_assets.warehouse.connection import Warehouse, transaction
from rastro_assets.warehouse.runs import SyncRunEnd, finish_sync_run, start_sync_run
from rastro_assets.warehouse.spend import (
    AccountNotLinked,
    DaySummary,
    SpendInputError,
    write_spend,
)

if TYPE_CHECKING:
    from rastro_assets.catalog_sync import CatalogOutcome, ThumbnailOutcome

log = logging.getLogger(__name__)

SYNC_KINDS = ("backfill", "gap", "live", "daily", "weekly", "manual")
MAX_ERROR_CHARS = 300

ERROR_CODES = {
    "token": "META_TOKEN_INVALID",
    "throttled": "RATE_LIMITED",
    "permission": "META_PERMISSION",
    "key": "SECRETS_KEY_MISSING",
    "other": "META_UNAVAILABLE",
}
_OUTCOME_OF_KIND = {
    ErrorKind.TOKEN: "token",
    ErrorKind.THROTTLED: "throttled",
    ErrorKind.PERMISSION: "permission",
}

ClientFactory = Callable[[str], MetaClient]


class SyncRefused(ValueError):
    """The request itself is wrong (unknown account, a date past local today)."""


@dataclass(frozen=True)
class SyncRequest:
    ad_account_id: str
    since: date
    until: date
    kind: str = "manual"
    run_id: str = "manual"
    catalog: bool = False


@dataclass
class SyncOutcome:
    """How one account sync ended. `error` is the contract's "CODE: message"."""

    request: SyncRequest
    timezone: str = "UTC"
    started_at: datetime | None = None
    outcome: str = "ok"  # ok | token | throttled | permission | key | other
    error: str | None = None
    rows_written: int = 0
    rows_deleted: int = 0
    api_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    regain_at: datetime | None = None
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
        return self.outcome == "ok"

    @property
    def unread_days(self) -> list[date]:
        read = set(self.complete_days) | set(self.incomplete_days)
        return [
            day for day in days_between(self.request.since, self.request.until) if day not in read
        ]

    @property
    def spend_total(self) -> Decimal:
        return sum((summary.spend for summary in self.days.values()), Decimal(0))


class Syncer:
    """Runs syncs against one warehouse with one way of reaching Meta."""

    def __init__(
        self,
        warehouse: Warehouse,
        client_factory: ClientFactory,
        *,
        vault_factory: Callable[[], Vault] = Vault.from_env,
        clock: Clock,
    ) -> None:
        self.warehouse = warehouse
        self.client_factory = client_factory
        self.vault_factory = vault_factory
        self.clock = clock

    def sync(self, request: SyncRequest, *, synced_at: datetime | None = None) -> SyncOutcome:
        """Make the warehouse equal Meta for the request's account-days.

        `synced_at` is the run's start: every row this sync writes carries it,
        so one run's rows are one version whatever the retries.
        """
        started_at = synced_at or self.clock()
        with self.warehouse.connect() as con:
            account = registry.get_account(con, request.ad_account_id)
            if account is None:
                raise SyncRefused(f"{request.ad_account_id} is not linked to any site")
            connection = registry.get_connection(con, account.connection_id)
            today = local_date(self.clock(), account.timezone)
            if request.until > today:
                raise SyncRefused(
                    f"{request.ad_account_id}: {request.until} is after the account's local "
                    f"today ({today} in {account.timezone}); Meta has no figures for it yet"
                )
            if request.since > request.until:
                raise SyncRefused(f"since {request.since} is after until {request.until}")
            token_sealed_at = connection.sealed_at if connection else None
            start_sync_run(
                con,
                run_id=request.run_id,
                ad_account_id=request.ad_account_id,
                kind=request.kind,
                since=request.since,
                until=request.until,
                started_at=started_at,
                catalog=request.catalog,
                token_sealed_at=token_sealed_at,
            )

        result = SyncOutcome(request=request, timezone=account.timezone, started_at=started_at)
        if connection is None or connection.status != "active":
            reason = (connection.last_error if connection else None) or "no valid token"
            self._fail(result, "token", f"the connection's token is invalid: {reason}")
        else:
            try:
                self._read_and_write(request, connection, started_at, result)
            except Exception as exc:  # noqa: BLE001 - recorded as this account's failure
                # An unexpected error must still end the run's row, or the
                # account would wait out the lease; its type says where to look.
                log.exception("%s: unexpected failure", request.ad_account_id)
                self._fail(result, "other", f"unexpected {type(exc).__name__} in the sync")
        self._finish(request, result, token_sealed_at)
        if result.ok:
            self._catalog_after_spend(request, result)
        return result

    def _catalog_after_spend(self, request: SyncRequest, result: SyncOutcome) -> None:
        """The full catalog and thumbnails when asked, else the unnamed ads with leads.

        Runs after the spend run is recorded, so nothing here can change what
        the spend sync reports; any failure, even an unexpected one, only
        lands in `catalog_error`.
        """
        # Imported here: catalog_sync builds on this module.
        from rastro_assets.catalog_sync import CatalogSyncer, safe_text

        syncer = CatalogSyncer(
            self.warehouse,
            self.client_factory,
            vault_factory=self.vault_factory,
            clock=self.clock,
        )
        account, run_id = request.ad_account_id, request.run_id
        try:
            result.catalog = syncer.sync_catalog(account, full=request.catalog, run_id=run_id)
            # Between full reads, only the ads just named by id can have a new
            # picture with a fresh URL; older failures wait for the daily read.
            only = None if request.catalog else result.catalog.named_ids
            if result.catalog.ok and (only is None or only):
                result.thumbnails = syncer.sync_thumbnails(account, run_id=run_id, only=only)
            errors = [
                part.error
                for part in (result.catalog, result.thumbnails)
                if part is not None and not part.ok
            ]
            result.catalog_error = "; ".join(e for e in errors if e) or None
        except Exception as exc:  # noqa: BLE001 - the spend is written; the catalog is extra
            result.catalog_error = (
                f"{ERROR_CODES['other']}: the catalog read failed"
                f" ({type(exc).__name__}: {safe_text(str(exc))})"
            )[:MAX_ERROR_CHARS]
        if result.catalog_error:
            log.warning("%s catalog: %s", account, result.catalog_error)

    def _read_and_write(self, request, connection, started_at, result: SyncOutcome) -> None:
        try:
            token = self.vault_factory().open(connection.connection_id, connection.sealed_token)
        except SecretsKeyError as exc:
            self._fail(result, "key", str(exc))
            return
        client = self.client_factory(token)
        del token
        try:
            for chunk in client.insights(request.ad_account_id, request.since, request.until):
                chunk_days = list(days_between(chunk.since, chunk.until))
                with self.warehouse.connect() as con, transaction(con):
                    written = write_spend(
                        con,
                        request.ad_account_id,
                        days=chunk_days,
                        rows=chunk.rows,
                        complete_days=chunk_days if chunk.complete else (),
                        synced_at=started_at,
                    )
                    # Names as they arrive: an ad is named long before the
                    # daily catalog read, and even if that read fails.
                    upsert_names_from_spend(con, request.ad_account_id, chunk.rows, started_at)
                result.rows_written += written.rows_written
                result.rows_deleted += written.rows_deleted
                if written.rows_written or written.rows_deleted:
                    result.changed_days.extend(chunk_days)
                result.days.update(written.days)
                (result.complete_days if chunk.complete else result.incomplete_days).extend(
                    chunk_days
                )
            if result.incomplete_days:
                days = ", ".join(day.isoformat() for day in result.incomplete_days)
                result.error = (
                    f"META_TRUNCATED: {days} could not be read completely, even by an async "
                    "report; their old rows were kept"
                )
        except MetaError as exc:
            outcome = _OUTCOME_OF_KIND.get(exc.kind, "other")
            result.token_rejected_by_meta = outcome == "token"
            self._fail(result, outcome, str(exc), regain_seconds=exc.regain_seconds)
        except AccountNotLinked:
            self._fail(result, "other", "the account was unlinked during the sync; nothing kept")
        except SpendInputError as exc:
            self._fail(result, "other", f"Meta sent figures the warehouse cannot hold: {exc}")
        finally:
            result.api_calls = client.stats.api_calls
            result.usage = client.stats.usage
            client.close()
        if result.ok and result.usage.regain_seconds:
            result.regain_at = self.clock() + timedelta(seconds=result.usage.regain_seconds)

    def _fail(
        self, result: SyncOutcome, outcome: str, message: str, regain_seconds: int | None = None
    ) -> None:
        result.outcome = outcome
        result.error = f"{ERROR_CODES[outcome]}: {message}"[:MAX_ERROR_CHARS]
        if regain_seconds:
            result.regain_at = self.clock() + timedelta(seconds=regain_seconds)
        log.warning("%s %s", result.request.ad_account_id, result.error)

    def _finish(self, request: SyncRequest, result: SyncOutcome, token_sealed_at) -> None:
        end = SyncRunEnd(
            finished_at=self.clock(),
            outcome=result.outcome,
            rows_written=result.rows_written,
            rows_deleted=result.rows_deleted,
            api_calls=result.api_calls,
            error=result.error,
            usage_pct=result.usage.pct,
            regain_at=result.regain_at,
            incomplete_days=tuple(result.incomplete_days),
        )
        with self.warehouse.connect() as con:
            if result.token_rejected_by_meta:
                account = registry.get_account(con, request.ad_account_id)
                if account is not None:
                    registry.mark_connection_invalid(
                        con,
                        account.connection_id,
                        result.error or "",
                        end.finished_at,
                        token_sealed_at=token_sealed_at,
                    )
            finish_sync_run(
                con, run_id=request.run_id, ad_account_id=request.ad_account_id, end=end
            )
