"""One account-range sync: read Meta, write the warehouse, return an outcome.

Knows nothing of Dagster: the assets, the live waves, the benchmarks and the
tests all call `Syncer.sync` the same way. The token is opened from the
vault inside the sync and dropped with it; it never leaves this function.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

import pyarrow as pa

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import MetaError
from rastro_assets.meta.models import InsightsChunk, Usage
from rastro_assets.outcomes import (
    Outcome,
    SyncKind,
    error_line,
    outcome_of,
)
from rastro_assets.timekeeping import Clock, days_between, local_date
from rastro_assets.vault import SecretsKeyError, Vault
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.catalog import upsert_names_from_spend, upsert_spend_names
from rastro_assets.warehouse.connection import Warehouse, transaction
from rastro_assets.warehouse.errors import AccountNotLinked
from rastro_assets.warehouse.runs import (
    SyncRunEnd,
    SyncRunStart,
    finish_sync_runs,
    start_sync_runs,
)
from rastro_assets.warehouse.spend import (
    DaySummary,
    SpendInputError,
    SpendWrite,
    SpendWriteResult,
    write_spend,
    write_spend_many,
)

if TYPE_CHECKING:
    from rastro_assets.catalog_sync import CatalogOutcome, ThumbnailOutcome

log = logging.getLogger(__name__)

SYNC_KINDS = tuple(SyncKind)
WAVE_WRITE_BATCH = 64
"""Accounts whose reads a wave writes in one batch."""

ClientFactory = Callable[[str], MetaClient]


class SyncRefused(ValueError):
    """The request itself is wrong (unknown account, a date past local today)."""


@dataclass(frozen=True)
class SyncRequest:
    ad_account_id: str
    since: date
    until: date
    kind: str = SyncKind.MANUAL
    run_id: str = "manual"
    catalog: bool = False


@dataclass
class SyncOutcome:
    """How one account sync ended. `error` is the contract's "CODE: message"."""

    request: SyncRequest
    timezone: str = "UTC"
    started_at: datetime | None = None
    outcome: Outcome = Outcome.OK
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


@dataclass(frozen=True)
class _Target:
    """A checked request with its account and connection as the sync started."""

    request: SyncRequest
    account: registry.LinkedAccount
    connection: registry.Connection | None

    @property
    def token_sealed_at(self) -> datetime | None:
        return self.connection.sealed_at if self.connection else None


class _DeadTokens:
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


class _FinishedRuns:
    """Closes finished runs' rows in batches; a refused token is marked at once."""

    BATCH = 200

    def __init__(self, syncer: Syncer) -> None:
        self._syncer = syncer
        self._ends: list[tuple[str, str, SyncRunEnd]] = []
        self._lock = threading.Lock()

    def add(self, target: _Target, result: SyncOutcome) -> None:
        if result.token_rejected_by_meta:
            with self._syncer.warehouse.connect() as con:
                self._syncer._mark_token(con, target, result)
        with self._lock:
            self._ends.append(self._syncer._end(target, result))
            full = len(self._ends) >= self.BATCH
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            ends, self._ends = self._ends, []
            if ends:
                with self._syncer.warehouse.connect() as con:
                    finish_sync_runs(con, ends)


class _SpendWriter:
    """Writes a read's chunks as they arrive, batched, while the read goes on.

    A backfill reads dozens of chunks: writing each on its own opened the
    file and checkpointed dozens of times. Chunks are gathered up to
    `FLUSH_ROWS` rows and each batch is written in one transaction on a
    writer thread, so DuckDB (which releases the GIL) works while the next
    pages download and parse; one batch waits at most, which bounds memory.
    A read of one chunk (every live sync) is written inline, without a thread.
    The file is opened only for a batch's write, never across a Meta call.
    """

    FLUSH_ROWS = 60_000

    def __init__(
        self,
        warehouse: Warehouse,
        ad_account_id: str,
        synced_at: datetime,
        result: SyncOutcome,
        *,
        defer: bool = False,
    ) -> None:
        self._warehouse = warehouse
        self._defer = defer
        self.deferred: _ReadBatch | None = None
        self._ad_account_id = ad_account_id
        self._synced_at = synced_at
        self._result = result
        self._pending: list[InsightsChunk] = []
        self._pending_rows = 0
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: Future[None] | None = None

    def add(self, chunk: InsightsChunk) -> None:
        self._pending.append(chunk)
        self._pending_rows += chunk.table.num_rows
        if self._pending_rows >= self.FLUSH_ROWS:
            self._wait()
            batch, self._pending, self._pending_rows = self._pending, [], 0
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="rastro-spend-writer")
            self._in_flight = self._executor.submit(self._write, batch)

    def flush(self) -> None:
        """Write what is left and wait for every write; a write's error is raised here.

        With `defer`, a read that never needed a write of its own is kept in
        `deferred` instead, for the wave to write with other accounts' reads.
        """
        self._wait()
        batch, self._pending, self._pending_rows = self._pending, [], 0
        if batch and self._defer and self._executor is None:
            self.deferred = _ReadBatch.of(batch)
        elif batch:
            self._write(batch)

    def flush_after_failed_read(self) -> None:
        """Keep the chunks read completely before the read failed; the read's error wins."""
        self._defer = False
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - the run already fails with the read's error
            log.warning("%s: the chunks read before the failure were not written either (%s)",
                        self._ad_account_id, type(exc).__name__)

    def shutdown(self) -> None:
        """Stop the writer thread, after any write still running (its error was reported)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _wait(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _write(self, batch: list[InsightsChunk]) -> None:
        read = _ReadBatch.of(batch)
        with self._warehouse.connect() as con, transaction(con):
            written = write_spend(
                con,
                self._ad_account_id,
                days=read.days,
                rows=read.rows,
                complete_days=read.complete_days,
                synced_at=self._synced_at,
            )
            # Names as they arrive: an ad is named long before the daily
            # catalog read, and even if that read fails.
            upsert_names_from_spend(con, self._ad_account_id, read.rows, self._synced_at)
        read.record(self._result, written)


@dataclass(frozen=True)
class _ReadBatch:
    """Chunks of one read, written as one: now by the read, or later by its wave."""

    days: list[date]
    complete_days: list[date]
    rows: pa.Table

    @classmethod
    def of(cls, chunks: list[InsightsChunk]) -> _ReadBatch:
        return cls(
            days=[day for chunk in chunks for day in days_between(chunk.since, chunk.until)],
            complete_days=[
                day
                for chunk in chunks
                if chunk.complete
                for day in days_between(chunk.since, chunk.until)
            ],
            rows=pa.concat_tables([chunk.table for chunk in chunks]),
        )

    def record(self, result: SyncOutcome, written: SpendWriteResult) -> None:
        """Add what this write did to the sync's outcome."""
        result.rows_written += written.rows_written
        result.rows_deleted += written.rows_deleted
        if written.rows_written or written.rows_deleted:
            result.changed_days.extend(self.days)
        result.days.update(written.days)
        result.complete_days.extend(self.complete_days)
        complete = set(self.complete_days)
        result.incomplete_days.extend(day for day in self.days if day not in complete)


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

        Raises:
            SyncRefused: the account is not linked, or the range is wrong.
        """
        started_at = synced_at or self.clock()
        targets, refused = self._start([request], started_at)
        if refused:
            raise refused[0][1]
        [target] = targets
        result, _ = self._read(target, started_at, _DeadTokens())
        with self.warehouse.connect() as con:
            self._mark_token(con, target, result)
            finish_sync_runs(con, [self._end(target, result)])
        if result.ok:
            self._catalog_after_spend(target, result)
        return result

    def sync_wave(
        self, requests: Sequence[SyncRequest], *, synced_at: datetime, concurrency: int
    ) -> WaveOutcome:
        """Sync many accounts at once, as cheaply per account as the work allows.

        One query finds every account and connection, one statement opens
        every run's lease, reads small enough are written `WAVE_WRITE_BATCH`
        accounts at a time, and finished runs are closed in batches: a wave
        of a thousand live syncs would otherwise spend most of its time on
        per-account statements. The file is held for the wave (see
        `Warehouse.held`). A token Meta refuses is marked dead at once, and
        the wave's later syncs on that connection do not call Meta with it.
        A sync that dies with the process leaves its run open until the
        lease runs out, as any killed run does.
        """
        with self.warehouse.held():
            targets, refused = self._start(requests, synced_at)
            dead = _DeadTokens()
            finished = _FinishedRuns(self)
            outcomes: list[SyncOutcome | None] = [None] * len(targets)
            try:
                with ThreadPoolExecutor(max_workers=concurrency) as pool:

                    def settle(target: _Target, result: SyncOutcome) -> None:
                        finished.add(target, result)
                        if result.ok:
                            pool.submit(self._catalog_after_spend, target, result)

                    reads = {
                        pool.submit(self._read, target, synced_at, dead, defer=True): index
                        for index, target in enumerate(targets)
                    }
                    waiting: list[tuple[_Target, SyncOutcome, _ReadBatch]] = []
                    for done, future in enumerate(as_completed(reads), start=1):
                        index = reads[future]
                        result, deferred = future.result()
                        outcomes[index] = result
                        if deferred is None:
                            settle(targets[index], result)
                        else:
                            waiting.append((targets[index], result, deferred))
                        if waiting and (len(waiting) >= WAVE_WRITE_BATCH or done == len(reads)):
                            # Written here while the pool goes on reading Meta.
                            self._write_together(waiting, synced_at)
                            for target, result, _ in waiting:
                                settle(target, result)
                            waiting = []
            finally:
                finished.flush()
        return WaveOutcome(
            outcomes=[outcome for outcome in outcomes if outcome is not None],
            refused=[(request, str(exc)) for request, exc in refused],
        )

    def _write_together(
        self, waiting: list[tuple[_Target, SyncOutcome, _ReadBatch]], synced_at: datetime
    ) -> None:
        """Write many accounts' reads in one batch; each outcome gets its own answer."""
        writes = [
            SpendWrite(target.request.ad_account_id, read.days, read.rows, read.complete_days)
            for target, _, read in waiting
        ]
        try:
            with self.warehouse.connect() as con:
                answers = write_spend_many(con, writes, synced_at=synced_at)
                written = [
                    (write.ad_account_id, write.rows)
                    for write, answer in zip(writes, answers, strict=True)
                    if isinstance(answer, SpendWriteResult)
                ]
                upsert_spend_names(con, written, synced_at)
        except Exception as exc:  # noqa: BLE001 - recorded as each account's failure
            log.exception("a batch of %d accounts' writes failed", len(waiting))
            for _, result, _ in waiting:
                if result.ok:
                    self._fail(
                        result, Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync"
                    )
            return
        for (_, result, read), answer in zip(waiting, answers, strict=True):
            if isinstance(answer, SpendWriteResult):
                read.record(result, answer)
                self._note_incomplete(result)
            else:
                self._fail_write(result, answer)

    def _start(
        self, requests: Sequence[SyncRequest], started_at: datetime
    ) -> tuple[list[_Target], list[tuple[SyncRequest, SyncRefused]]]:
        """Check each request and open the lease of every one that can run."""
        targets: list[_Target] = []
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
                    account = self._linked(request, accounts, now)
                except SyncRefused as exc:
                    refused.append((request, exc))
                    continue
                targets.append(_Target(request, account, connections.get(account.connection_id)))
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

    @staticmethod
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

    def _read(
        self, target: _Target, started_at: datetime, dead: _DeadTokens, *, defer: bool = False
    ) -> tuple[SyncOutcome, _ReadBatch | None]:
        """Read Meta and write the warehouse for one started sync; never raises.

        With `defer`, a read small enough to need no write of its own comes
        back unwritten, for the caller to write with others.
        """
        request, connection = target.request, target.connection
        result = SyncOutcome(
            request=request, timezone=target.account.timezone, started_at=started_at
        )
        dead_error = dead.error(connection.connection_id) if connection else None
        if connection is None or connection.status != "active" or dead_error:
            reason = dead_error or (connection.last_error if connection else None)
            reason = reason or "no valid token"
            self._fail(result, Outcome.TOKEN, f"the connection's token is invalid: {reason}")
            return result, None
        deferred = None
        try:
            deferred = self._read_and_write(request, connection, started_at, result, defer)
        except Exception as exc:  # noqa: BLE001 - recorded as this account's failure
            # An unexpected error must still end the run's row, or the
            # account would wait out the lease; its type says where to look.
            log.exception("%s: unexpected failure", request.ad_account_id)
            self._fail(result, Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync")
        if result.token_rejected_by_meta:
            dead.add(connection.connection_id, result.error or "")
        return result, deferred if result.ok else None

    def _catalog_after_spend(self, target: _Target, result: SyncOutcome) -> None:
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
        request = target.request
        account, run_id = request.ad_account_id, request.run_id
        try:
            result.catalog = syncer.sync_catalog(
                account,
                full=request.catalog,
                run_id=run_id,
                known=(target.account, target.connection),
            )
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
            result.catalog_error = error_line(
                Outcome.OTHER,
                f"the catalog read failed ({type(exc).__name__}: {safe_text(str(exc))})",
            )
        if result.catalog_error:
            log.warning("%s catalog: %s", account, result.catalog_error)

    def _read_and_write(
        self, request, connection, started_at, result: SyncOutcome, defer: bool = False
    ) -> _ReadBatch | None:
        try:
            token = self.vault_factory().open(connection.connection_id, connection.sealed_token)
        except SecretsKeyError as exc:
            self._fail(result, Outcome.KEY, str(exc))
            return None
        client = self.client_factory(token)
        del token
        writer = _SpendWriter(
            self.warehouse, request.ad_account_id, started_at, result, defer=defer
        )
        try:
            try:
                for chunk in client.insights(request.ad_account_id, request.since, request.until):
                    writer.add(chunk)
            except MetaError:
                writer.flush_after_failed_read()
                raise
            writer.flush()
            self._note_incomplete(result)
        except MetaError as exc:
            outcome = outcome_of(exc.kind)
            result.token_rejected_by_meta = outcome == Outcome.TOKEN
            self._fail(result, outcome, str(exc), regain_seconds=exc.regain_seconds)
        except (AccountNotLinked, SpendInputError) as exc:
            self._fail_write(result, exc)
        finally:
            writer.shutdown()
            result.api_calls = client.stats.api_calls
            result.usage = client.stats.usage
            client.close()
        if result.ok and result.usage.regain_seconds:
            result.regain_at = self.clock() + timedelta(seconds=result.usage.regain_seconds)
        return writer.deferred

    @staticmethod
    def _note_incomplete(result: SyncOutcome) -> None:
        if result.incomplete_days:
            days = ", ".join(day.isoformat() for day in result.incomplete_days)
            result.error = (
                f"META_TRUNCATED: {days} could not be read completely, even by an async "
                "report; their old rows were kept"
            )

    def _fail_write(self, result: SyncOutcome, exc: AccountNotLinked | SpendInputError) -> None:
        if isinstance(exc, AccountNotLinked):
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

    def _end(self, target: _Target, result: SyncOutcome) -> tuple[str, str, SyncRunEnd]:
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

    def _mark_token(self, con, target: _Target, result: SyncOutcome) -> None:
        """Mark the connection dead when Meta refused its token during this sync."""
        if result.token_rejected_by_meta:
            registry.mark_connection_invalid(
                con,
                target.account.connection_id,
                result.error or "",
                self.clock(),
                token_sealed_at=target.token_sealed_at,
            )
