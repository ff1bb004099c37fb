"""One account's spend sync, in the steps a caller chains: start, read, write, end.

`start` checks requests and opens their runs' leases in one statement; `read`
opens the token from the vault (it never leaves the read), reads Meta through
`reader.read_spend` and writes what cannot wait; `write` writes the reads
that fit one batch, one account's or many at once; `end` closes the runs'
rows. `syncer.Syncer` chains them for one sync or for a wave.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta

from rastro_assets.meta.errors import MetaError
from rastro_assets.outcomes import (
    FILL_KINDS,
    MAX_ERROR_CHARS,
    ConnectionStatus,
    Outcome,
    error_line,
)
from rastro_assets.sync.reader import SpendBatch, read_spend
from rastro_assets.sync.types import SyncOutcome, SyncRefused, SyncRequest, Wiring, outcome_of
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import SecretsKeyError
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.catalog import upsert_spend_names
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.errors import AccountNotLinked, AccountTakenOver, WriteRefusal
from rastro_assets.warehouse.runs import (
    SyncRunEnd,
    SyncRunStart,
    start_sync_runs,
)
from rastro_assets.warehouse.spend import (
    SpendInputError,
    SpendWrite,
    SpendWriteResult,
    write_spend_many,
)

log = logging.getLogger(__name__)

SIZING_HISTORY_DAYS = 35
"""Days of history before a read whose rows per day size its insights ranges."""


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
class Unwritten:
    """A read that fit one batch, with its outcome, waiting for `SpendSync.write`."""

    target: Target
    result: SyncOutcome
    batch: SpendBatch


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

    def read(
        self, target: Target, started_at: datetime, dead: DeadTokens
    ) -> tuple[SyncOutcome, Unwritten | None]:
        """Read Meta for one started sync and write what cannot wait; never raises.

        A read that fits one batch comes back unwritten, for `write` to write
        alone or with other accounts' reads; a larger one is written here,
        batch by batch, while the read goes on.
        """
        request, connection = target.request, target.connection
        result = SyncOutcome(
            request=request,
            timezone=target.account.timezone,
            currency=target.account.currency,
            started_at=started_at,
        )
        dead_error = dead.error(connection.connection_id) if connection else None
        if connection is None or connection.status != ConnectionStatus.ACTIVE or dead_error:
            reason = dead_error or (connection.last_error if connection else None)
            reason = reason or "no valid token"
            self._fail(result, Outcome.TOKEN, f"the connection's token is invalid: {reason}")
            return result, None
        unwritten = None
        try:
            batch = self._read_and_write(target, started_at, result)
            unwritten = Unwritten(target, result, batch) if batch is not None else None
        except Exception as exc:  # noqa: BLE001 - recorded as this account's failure
            # An unexpected error must still end the run's row, or the
            # account would wait out the lease; its type says where to look.
            log.exception("%s: unexpected failure", request.ad_account_id)
            self._fail(result, Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync")
        if result.token_rejected_by_meta:
            dead.add(connection.connection_id, result.error or "")
        if not result.ok:
            return result, None
        if unwritten is None:
            note_incomplete(result)
        return result, unwritten

    def write(self, reads: Sequence[Unwritten], synced_at: datetime) -> None:
        """Write reads of one batch each, of one account or many, in one batch.

        A live wave writes a few dozen rows for each of hundreds of accounts:
        one set of statements for all of them costs a fraction of one each.
        Each outcome gets its own answer; a failure of the batch as a whole
        fails each sync in it, and never raises.
        """
        try:
            answers = self._write_batches(
                [(read.target.request.ad_account_id, read.batch) for read in reads], synced_at
            )
        except Exception as exc:  # noqa: BLE001 - recorded as each account's failure
            log.exception("a batch of %d accounts' writes failed", len(reads))
            for read in reads:
                if read.result.ok:
                    self._fail(
                        read.result, Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync"
                    )
            return
        for read, answer in zip(reads, answers, strict=True):
            if isinstance(answer, SpendWriteResult):
                record(read.result, read.batch, answer)
                note_incomplete(read.result)
            else:
                self._fail_write(read.result, answer)

    def end(self, target: Target, result: SyncOutcome) -> tuple[str, str, SyncRunEnd]:
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
        )
        return target.request.run_id, target.request.ad_account_id, end

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

    def _read_and_write(
        self, target: Target, started_at: datetime, result: SyncOutcome
    ) -> SpendBatch | None:
        request, connection = target.request, target.connection
        try:
            token = self.vault_factory().open(connection.connection_id, connection.sealed_token)
        except SecretsKeyError as exc:
            self._fail(result, Outcome.KEY, str(exc))
            return None
        client = self.client_factory(token)
        del token
        writer = _BatchWriter(self, request.ad_account_id, started_at, result)
        unwritten = None
        try:
            try:
                batches = read_spend(client, request.ad_account_id, request.since, request.until,
                                     rows_per_day=target.rows_per_day)
                for batch in batches:
                    if batch.whole:
                        unwritten = batch
                    else:
                        writer.submit(batch)
                writer.wait()
            except MetaError:
                writer.wait_after_failed_read()
                raise
        except MetaError as exc:
            outcome = outcome_of(exc.kind)
            result.token_rejected_by_meta = outcome == Outcome.TOKEN
            # A throttle that names no wait of its own waits for the longest
            # one Meta announced earlier in this read: the quota it named is still spent.
            regain = exc.regain_seconds or client.stats.usage.regain_seconds
            self._fail(result, outcome, str(exc), regain_seconds=regain)
        except (AccountNotLinked, AccountTakenOver, SpendInputError) as exc:
            self._fail_write(result, exc)
        finally:
            writer.shutdown()
            result.api_calls = client.stats.api_calls
            result.usage = client.stats.usage
            client.close()
        if result.ok and result.usage.regain_seconds:
            result.regain_at = self.clock() + timedelta(seconds=result.usage.regain_seconds)
        return unwritten

    def _write_batches(
        self, reads: Sequence[tuple[str, SpendBatch]], synced_at: datetime
    ) -> list[SpendWriteResult | WriteRefusal]:
        """The one spend write: the figures, then the names the same reads brought.

        Names are kept as they arrive: an ad is named long before the daily
        catalog read, and even if that read fails.
        """
        writes = [
            SpendWrite(account, batch.days, batch.rows, batch.complete_days)
            for account, batch in reads
        ]
        with self.warehouse.connect() as con:
            answers = write_spend_many(con, writes, synced_at=synced_at)
            upsert_spend_names(
                con,
                [
                    (write.ad_account_id, write.rows)
                    for write, answer in zip(writes, answers, strict=True)
                    if isinstance(answer, SpendWriteResult)
                ],
                synced_at,
            )
        return answers

    def _fail_write(self, result: SyncOutcome, exc: WriteRefusal) -> None:
        if isinstance(exc, AccountTakenOver):
            # The contract's code for a run that lost its hold on the account.
            result.outcome = Outcome.OTHER
            result.error = f"RUN_TIMEOUT: {exc}"[:MAX_ERROR_CHARS]
            log.warning("%s %s", result.request.ad_account_id, result.error)
        elif isinstance(exc, AccountNotLinked):
            self._fail(
                result, Outcome.OTHER, "the account was unlinked during the sync; nothing kept"
            )
        else:
            self._fail(result, Outcome.OTHER, f"Meta sent figures the warehouse cannot hold: {exc}")

    def _fail(
        self,
        result: SyncOutcome,
        outcome: Outcome,
        message: str,
        regain_seconds: int | None = None,
    ) -> None:
        result.outcome = outcome
        result.error = error_line(outcome, message)
        if regain_seconds:
            result.regain_at = self.clock() + timedelta(seconds=regain_seconds)
        log.warning("%s %s", result.request.ad_account_id, result.error)


class _BatchWriter:
    """Writes one large read's batches on a thread while the read goes on.

    DuckDB releases the GIL, so a batch is written while the next pages
    download and parse; one write in flight at most bounds memory. The file
    is opened only for a batch's write, never across a Meta call.
    """

    def __init__(
        self, sync: SpendSync, ad_account_id: str, synced_at: datetime, result: SyncOutcome
    ) -> None:
        self._sync = sync
        self._ad_account_id = ad_account_id
        self._synced_at = synced_at
        self._result = result
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: Future[None] | None = None

    def submit(self, batch: SpendBatch) -> None:
        """Write `batch` after the write in flight; a write's error is raised here or by `wait`."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rastro-spend-writer")
        self._in_flight = self._executor.submit(self._write, batch)

    def wait(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def wait_after_failed_read(self) -> None:
        """Let the last write finish; the read's error wins over the write's."""
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 - the run already fails with the read's error
            log.warning("%s: the chunks read before the failure were not written either (%s)",
                        self._ad_account_id, type(exc).__name__)

    def shutdown(self) -> None:
        """Stop the writer thread, after any write still running (its error was reported)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _write(self, batch: SpendBatch) -> None:
        [answer] = self._sync._write_batches([(self._ad_account_id, batch)], self._synced_at)
        if not isinstance(answer, SpendWriteResult):
            raise answer
        record(self._result, batch, answer)


def record(result: SyncOutcome, batch: SpendBatch, written: SpendWriteResult) -> None:
    """Add what one batch's write did to the sync's outcome."""
    result.rows_written += written.rows_written
    result.rows_deleted += written.rows_deleted
    if written.rows_written or written.rows_deleted:
        result.changed_days.extend(batch.days)
    result.days.update(written.days)
    result.complete_days.extend(batch.complete_days)
    result.incomplete_days.extend(batch.incomplete_days)


def note_incomplete(result: SyncOutcome) -> None:
    """Name the days Meta never answered whole; the sync still counts as read."""
    if result.incomplete_days:
        days = ", ".join(day.isoformat() for day in result.incomplete_days)
        result.error = (
            f"META_TRUNCATED: {days} could not be read completely, even by an async "
            "report; their old rows were kept"
        )[:MAX_ERROR_CHARS]


def busiest_days(con, targets: Sequence[Target]) -> dict[str, int]:
    """Each target account's most ad rows in one day, from `SIZING_HISTORY_DAYS` before
    the earliest range asked on.

    One statement for the whole wave. A backfill's later blocks learn from its earlier
    ones, whichever way round they run.
    """
    if not targets:
        return {}
    earliest = min(target.request.since for target in targets)
    accounts = sorted({target.request.ad_account_id for target in targets})
    found = con.execute(
        "SELECT ad_account_id, max(n) FROM ("
        " SELECT ad_account_id, day, count(*) AS n FROM ad_spend_daily"
        " WHERE day >= ? AND ad_account_id IN (SELECT unnest(?::VARCHAR[]))"
        " GROUP BY ad_account_id, day"
        ") GROUP BY ad_account_id",
        [earliest - timedelta(days=SIZING_HISTORY_DAYS), accounts],
    ).fetchall()
    return {account: int(rows) for account, rows in found}


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
    today = local_date(now, account.timezone)
    if request.until > today:
        raise SyncRefused(
            f"{request.ad_account_id}: {request.until} is after the account's local "
            f"today ({today} in {account.timezone}); Meta has no figures for it yet"
        )
    if request.since > request.until:
        raise SyncRefused(f"since {request.since} is after until {request.until}")
    return account
