"""The read of one account's spend sync, in the steps a caller chains: start, read, end.

`start` checks requests and opens their runs' leases in one statement; `read`
returns Meta's answer as batches, read as they are asked for, and never
writes: the token is opened from the vault when the first batch is asked for
and never leaves the read. How the read ended is returned (`SpendRead.end`),
never written into an outcome. `spend_write.SpendWriter` writes what the read
brings; `end` closes the runs' rows. `syncer.Syncer` chains them for one sync
or for a wave, and folds what each step returned into the sync's outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta

from rastro_assets.meta.errors import MetaError
from rastro_assets.meta.insights import META_INSIGHTS_MONTHS
from rastro_assets.meta.models import Usage
from rastro_assets.outcomes import FILL_KINDS, ConnectionStatus, Outcome
from rastro_assets.sync.reader import SpendBatch, read_spend
from rastro_assets.sync.types import (
    Failure,
    SyncOutcome,
    SyncRefused,
    SyncRequest,
    Wiring,
    outcome_of,
)
from rastro_assets.timekeeping import local_date, months_before
from rastro_assets.vault import SecretsKeyError
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Connection, transaction
from rastro_assets.warehouse.figures import most_ad_rows_in_a_day
from rastro_assets.warehouse.runs import (
    SyncKey,
    SyncRunEnd,
    SyncRunStart,
    start_sync_runs,
)

SIZING_HISTORY_DAYS = 35
"""Days of history before a read whose rows per day size its insights ranges."""


class DeadTokens:
    """Connections whose token Meta refused during this wave, with the first error."""

    def __init__(self) -> None:
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, connection_id: str, error: str) -> None:
        with self._lock:
            self._errors.setdefault(connection_id, error)

    def error(self, connection_id: str) -> str | None:
        with self._lock:
            return self._errors.get(connection_id)


@dataclass(frozen=True)
class Target:
    """A checked request with its account and connection as the sync started."""

    request: SyncRequest
    account: registry.LinkedAccount
    connection: registry.Connection | None
    rows_per_day: int | None = None
    """The most ad rows one day of the account held lately: sizes the insights ranges."""

    @property
    def token_sealed_at(self) -> datetime | None:
        return self.connection.sealed_at if self.connection else None


@dataclass(frozen=True)
class ReadEnded:
    """How a read ended: Meta's calls and usage, and its failure when it failed."""

    api_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    failure: Failure | None = None
    token_rejected_by_meta: bool = False
    """Meta refused the token during the read (not a read refused before calling Meta)."""


def _no_batches() -> Generator[SpendBatch, None, None]:
    yield from ()


@dataclass
class SpendRead:
    """One started sync's read: Meta's answer as it comes, and how the read ended.

    `batches` reads Meta as it is iterated; its last batch may be the read's whole
    answer (`SpendBatch.whole`). A failure ends it, is never raised, and is in `end`
    once the iteration is over (set on the thread that iterates).
    """

    target: Target
    started_at: datetime
    batches: Generator[SpendBatch, None, None] = field(default_factory=_no_batches)
    ended: ReadEnded | None = None

    @property
    def end(self) -> ReadEnded:
        """How the read ended; a read that broke before reaching Meta called it zero times."""
        return self.ended or ReadEnded()

    @property
    def failed(self) -> bool:
        return self.end.failure is not None


class SpendSync(Wiring):
    """The steps of spend syncs against one warehouse with one way of reaching Meta."""

    def start(
        self, requests: Sequence[SyncRequest], started_at: datetime
    ) -> tuple[list[Target], list[tuple[SyncRequest, SyncRefused]]]:
        """Check each request and open the lease of every one that can run."""
        targets: list[Target] = []
        refused: list[tuple[SyncRequest, SyncRefused]] = []
        now = self.clock()
        with self.warehouse.connect() as con, transaction(con):
            if len(requests) == 1:
                found = registry.get_account(con, requests[0].ad_account_id)
                accounts = {found.ad_account_id: found} if found else {}
            else:
                accounts = {a.ad_account_id: a for a in registry.linked_accounts(con)}
            connections = registry.get_connections(
                con, {account.connection_id for account in accounts.values()}
            )
            for request in requests:
                try:
                    account = _linked(request, accounts, now)
                except SyncRefused as exc:
                    refused.append((request, exc))
                    continue
                request = _with_catalog_if_last_block(request, local_date(now, account.timezone))
                targets.append(Target(request, account, connections.get(account.connection_id)))
            busiest = busiest_days(con, targets)
            targets = [
                replace(target, rows_per_day=busiest.get(target.request.ad_account_id))
                for target in targets
            ]
            start_sync_runs(
                con,
                [
                    SyncRunStart(
                        run_id=target.request.run_id,
                        ad_account_id=target.request.ad_account_id,
                        kind=target.request.kind,
                        since=target.request.since,
                        until=target.request.until,
                        started_at=started_at,
                        catalog=target.request.catalog,
                        token_sealed_at=target.token_sealed_at,
                    )
                    for target in targets
                ],
            )
        return targets, refused

    def read(self, target: Target, started_at: datetime, dead: DeadTokens) -> SpendRead:
        """Meta's answer for one started sync, as batches read when iterated; never writes.

        Neither this nor the iteration raises for Meta's failures, a missing
        key or a dead token: they end the read and are returned in its `end`.
        """
        connection = target.connection
        dead_error = dead.error(connection.connection_id) if connection else None
        if connection is None or connection.status != ConnectionStatus.ACTIVE or dead_error:
            reason = dead_error or (connection.last_error if connection else None)
            reason = reason or "no valid token"
            refused = Failure.of(Outcome.TOKEN, f"the connection's token is invalid: {reason}")
            return SpendRead(target, started_at, ended=ReadEnded(failure=refused))
        read = SpendRead(target, started_at)
        read.batches = self._batches(read)
        return read

    def _batches(self, read: SpendRead) -> Generator[SpendBatch, None, None]:
        request, connection = read.target.request, read.target.connection
        try:
            token = self.vault_factory().open(connection.connection_id, connection.sealed_token)
        except SecretsKeyError as exc:
            read.ended = ReadEnded(failure=Failure.of(Outcome.KEY, str(exc)))
            return
        client = self.client_factory(token)
        del token
        failure, rejected = None, False
        try:
            yield from read_spend(client, request.ad_account_id, request.since, request.until,
                                  rows_per_day=read.target.rows_per_day)
        except MetaError as exc:
            outcome = outcome_of(exc.kind)
            rejected = outcome == Outcome.TOKEN
            # A throttle that names no wait of its own waits for the longest
            # one Meta announced earlier in this read: the quota it named is still spent.
            regain = exc.regain_seconds or client.stats.usage.regain_seconds
            failure = Failure.of(
                outcome, str(exc), regain_at=self._after(regain), rate_limit=exc.limit
            )
        finally:
            read.ended = ReadEnded(client.stats.api_calls, client.stats.usage, failure, rejected)
            client.close()

    def _after(self, seconds: int | None) -> datetime | None:
        return self.clock() + timedelta(seconds=seconds) if seconds else None

    def end(self, target: Target, result: SyncOutcome) -> tuple[SyncKey, SyncRunEnd]:
        """The run's row as the sync ended, for `finish_sync_runs`."""
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
            rate_limit=result.rate_limit,
            account_usage_pct=result.usage.account_pct,
        )
        request = target.request
        return (request.run_id, request.ad_account_id, request.since), end

    def mark_token(self, con, target: Target, result: SyncOutcome) -> None:
        """Mark the connection dead when Meta refused its token during this sync."""
        if result.token_rejected_by_meta:
            registry.mark_connection_invalid(
                con,
                target.account.connection_id,
                result.error or "",
                self.clock(),
                token_sealed_at=target.token_sealed_at,
            )


def busiest_days(con: Connection, targets: Sequence[Target]) -> dict[str, int]:
    """Each target account's most ad rows in one day, from `SIZING_HISTORY_DAYS` before
    the earliest range asked on.

    One statement for the whole wave. A backfill's later blocks learn from its earlier
    ones, whichever way round they run.
    """
    if not targets:
        return {}
    earliest = min(target.request.since for target in targets)
    accounts = sorted({target.request.ad_account_id for target in targets})
    return most_ad_rows_in_a_day(con, accounts, earliest - timedelta(days=SIZING_HISTORY_DAYS))


def _with_catalog_if_last_block(request: SyncRequest, today: date) -> SyncRequest:
    """A fill's block that reaches the account's local today is its last: it reads the catalog.

    The planner then counts it as the daily and weekly re-sync (`planner.marks`),
    so a new account's backfill is not followed by a 7- or 28-day read of days
    it has just read.
    """
    if request.kind in FILL_KINDS and request.until >= today and not request.catalog:
        return replace(request, catalog=True)
    return request


def _linked(
    request: SyncRequest, accounts: Mapping[str, registry.LinkedAccount], now: datetime
) -> registry.LinkedAccount:
    account = accounts.get(request.ad_account_id)
    if account is None:
        raise SyncRefused(f"{request.ad_account_id} is not linked to any site")
    refusal = range_refusal(request, local_date(now, account.timezone), account.timezone)
    if refusal is not None:
        raise SyncRefused(refusal)
    return account


def range_refusal(request: SyncRequest, today: date, timezone: str) -> str | None:
    """Why Meta cannot answer the request's range for an account whose local today is
    `today`, in one line; None when it can.

    Checked before any read: a range Meta refuses whole would end the sync failed and hold
    the account back as if Meta were down.
    """
    account = request.ad_account_id
    if request.since > request.until:
        return f"{account}: since {request.since} is after until {request.until}"
    if request.until > today:
        return (
            f"{account}: {request.until} is after the account's local "
            f"today ({today} in {timezone}); Meta has no figures for it yet"
        )
    oldest = months_before(today, META_INSIGHTS_MONTHS)
    if request.since < oldest:
        return (
            f"{account}: {request.since} is before {oldest}, the first day Meta still keeps"
            f" ({META_INSIGHTS_MONTHS} months before the account's local today, {today})"
        )
    return None
