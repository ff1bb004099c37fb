"""The caller of the sync steps: one sync or a wave, the catalog chained after the spend.

The assets, the live waves, the benchmarks and the tests all sync through
`Syncer`. It owns the outcome: the spend's steps return what they did, which
`Syncer._fold` alone takes into it, on the thread that called the step; the
catalog read after a spend that went well adds to it without changing how the
spend ended.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, fields
from datetime import datetime

from rastro_assets.meta.limits import account_hold
from rastro_assets.outcomes import MAX_ERROR_CHARS, Outcome, error_line
from rastro_assets.sync.catalog import CatalogSyncer, safe_text
from rastro_assets.sync.spend_read import DeadTokens, ReadEnded, SpendSync, Target
from rastro_assets.sync.spend_write import SpendWriter, SpendWritten, Unwritten
from rastro_assets.sync.types import Failure, SyncOutcome, SyncRequest, WaveOutcome, Wiring
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.runs import SyncKey, SyncRunEnd, finish_sync_runs

log = logging.getLogger(__name__)

WAVE_WRITE_BATCH = 64
"""Accounts whose reads a wave writes in one batch."""


@dataclass
class Syncer(Wiring):
    """Runs syncs against one warehouse with one way of reaching Meta."""

    # Made on each use, so a wiring changed after construction reaches every step.
    @property
    def spend(self) -> SpendSync:
        return SpendSync(**self._wiring())

    @property
    def writer(self) -> SpendWriter:
        return SpendWriter(self.warehouse)

    @property
    def catalog(self) -> CatalogSyncer:
        return CatalogSyncer(**self._wiring())

    def _wiring(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(Wiring)}

    def sync(self, request: SyncRequest, *, synced_at: datetime | None = None) -> SyncOutcome:
        """Make the warehouse equal Meta for the request's account-days.

        `synced_at` is the run's start: every row this sync writes carries it,
        so one run's rows are one version whatever the retries.

        Raises:
            SyncRefused: the account is not linked, or the range is wrong.
        """
        started_at = synced_at or self.clock()
        spend, writer = self.spend, self.writer
        targets, refused = spend.start([request], started_at)
        if refused:
            raise refused[0][1]
        [target] = targets
        result, unwritten = self._read(spend, writer, target, started_at, DeadTokens())
        if unwritten is not None:
            [written] = writer.write_many([unwritten], started_at)
            self._fold(result, written)
        full_catalog = result.ok and target.request.catalog
        if full_catalog:
            self.catalog_after_spend(target, result)
        with self.warehouse.connect() as con:
            spend.mark_token(con, target, result)
            finish_sync_runs(con, [spend.end(target, result)])
        if result.ok and not full_catalog:
            self.catalog_after_spend(target, result)
        return result

    def sync_wave(
        self,
        requests: Sequence[SyncRequest],
        *,
        synced_at: datetime,
        concurrency: int,
        started_at: datetime | None = None,
        on_written: Callable[[SyncOutcome], None] | None = None,
    ) -> WaveOutcome:
        """Sync many accounts at once, as cheaply per account as the work allows.

        One query finds every account and connection, one statement opens
        every run's lease, reads that fit one batch are written
        `WAVE_WRITE_BATCH` accounts at a time, and finished runs are closed in
        batches: a wave of a thousand live syncs would otherwise spend most of
        its time on per-account statements. The file is held for the wave (see
        `Warehouse.held`). A token Meta refuses is marked dead at once, and
        the wave's later syncs on that connection do not call Meta with it.
        A sync that dies with the process leaves its run open until the
        lease runs out, as any killed run does.

        `started_at` opens the syncs' leases when a run reaches them later than its
        start (`synced_at`, which every row written carries); `on_written` is called,
        on this thread, with each outcome once its rows are committed.
        """
        spend, writer = self.spend, self.writer
        with self.warehouse.held():
            targets, refused = spend.start(requests, started_at or synced_at)
            dead = DeadTokens()
            finished = _FinishedRuns(self.warehouse, spend)
            outcomes: list[SyncOutcome | None] = [None] * len(targets)
            try:
                with ThreadPoolExecutor(max_workers=concurrency) as pool:

                    def settle(target: Target, result: SyncOutcome) -> None:
                        if on_written is not None:
                            on_written(result)
                        if result.ok and target.request.catalog:
                            pool.submit(self._catalog_then_end, target, result, finished)
                            return
                        finished.add(target, result)
                        if result.ok:
                            pool.submit(self.catalog_after_spend, target, result)

                    reads = {
                        pool.submit(self._read, spend, writer, target, synced_at, dead): index
                        for index, target in enumerate(targets)
                    }
                    self._write_as_read(reads, targets, outcomes, synced_at, settle)
            finally:
                finished.flush()
        return WaveOutcome(
            outcomes=[outcome for outcome in outcomes if outcome is not None],
            refused=[(request, str(exc)) for request, exc in refused],
        )

    def _write_as_read(
        self,
        reads: dict[Future, int],
        targets: Sequence[Target],
        outcomes: list[SyncOutcome | None],
        synced_at: datetime,
        settle: Callable[[Target, SyncOutcome], None],
    ) -> None:
        """Take each of a wave's reads as it finishes (`reads` maps each to its target's
        index): its outcome goes in `outcomes`; its rows wait for `WAVE_WRITE_BATCH` others,
        or the last read, to be written with them; then it is settled."""
        waiting: list[tuple[SyncOutcome, Unwritten]] = []
        for done, future in enumerate(as_completed(reads), start=1):
            index = reads[future]
            result, unwritten = future.result()
            outcomes[index] = result
            if unwritten is None:
                settle(targets[index], result)
            else:
                waiting.append((result, unwritten))
            if waiting and (len(waiting) >= WAVE_WRITE_BATCH or done == len(reads)):
                # Written here while the pool goes on reading Meta.
                written = self.writer.write_many([read for _, read in waiting], synced_at)
                for (result, _), each in zip(waiting, written, strict=True):
                    self._fold(result, each)
                for result, read in waiting:
                    settle(read.target, result)
                waiting = []

    def _read(
        self,
        spend: SpendSync,
        writer: SpendWriter,
        target: Target,
        started_at: datetime,
        dead: DeadTokens,
    ) -> tuple[SyncOutcome, Unwritten | None]:
        """One account's read, a large one written as it comes; a small one comes back unwritten.

        A token Meta refused is noted in `dead`, so the wave's later reads on that
        connection do not call Meta with it.
        """
        read = spend.read(target, started_at, dead)
        written, unwritten = writer.take(read)
        result = SyncOutcome(
            request=target.request,
            timezone=target.account.timezone,
            currency=target.account.currency,
            started_at=started_at,
        )
        self._fold(result, written, read.end)
        if result.token_rejected_by_meta:
            dead.add(target.account.connection_id, result.error or "")
        return result, unwritten

    def _fold(
        self, result: SyncOutcome, written: SpendWritten, read: ReadEnded | None = None
    ) -> None:
        """Take what a spend step returned into the sync's outcome: the read with the
        writes made as it went, or the later write of a read that fit one batch.

        The one place the spend's steps reach the outcome, always on the thread that
        called the step: the writer thread returns what it wrote and changes nothing.
        """
        if read is not None:
            result.api_calls, result.usage = read.api_calls, read.usage
            result.token_rejected_by_meta = read.token_rejected_by_meta
            if read.failure is not None:
                _end(result, read.failure)
        result.rows_written += written.rows_written
        result.rows_deleted += written.rows_deleted
        result.changed_days.extend(written.changed_days)
        result.days.update(written.days)
        result.complete_days.extend(written.complete_days)
        result.incomplete_days.extend(written.incomplete_days)
        if written.failure is not None:
            _end(result, written.failure)
        if not result.ok:
            return
        held = account_hold(result.usage) if read is not None else None
        if held is not None:
            result.regain_at = self.clock() + held
            result.rate_limit = result.rate_limit or result.usage.limit
        if result.incomplete_days:
            # The days Meta never answered whole are named; the sync still counts as read.
            days = ", ".join(day.isoformat() for day in result.incomplete_days)
            result.error = (
                f"META_TRUNCATED: {days} could not be read completely, even by an async "
                "report; their old rows were kept"
            )[:MAX_ERROR_CHARS]

    def _catalog_then_end(
        self, target: Target, result: SyncOutcome, finished: _FinishedRuns
    ) -> None:
        self.catalog_after_spend(target, result)
        finished.add(target, result)

    def catalog_after_spend(self, target: Target, result: SyncOutcome) -> None:
        """The full catalog and thumbnails when asked, else the unnamed ads with leads.

        A full catalog read belongs to its run (a daily re-sync, a fill's last
        block): it runs before the run's row is closed, its Meta usage counts
        toward the run's back-off, and its failure is the run's, so the re-sync
        is not marked done and is retried after the usual back-off. The names
        of unnamed ads are a courtesy of a live sync: their failure only lands
        in `catalog_error`.
        """
        catalog = self.catalog
        request = target.request
        account, run_id = request.ad_account_id, request.run_id
        try:
            result.catalog = catalog.sync_catalog(
                account,
                full=request.catalog,
                run_id=run_id,
                known=(target.account, target.connection),
            )
            # Between full reads, only the ads just named by id can have a new
            # picture with a fresh URL; older failures wait for the daily read.
            only = None if request.catalog else result.catalog.named_ids
            if result.catalog.ok and (only is None or only):
                result.thumbnails = catalog.sync_thumbnails(account, run_id=run_id, only=only)
            errors = [
                part.error
                for part in (result.catalog, result.thumbnails)
                if part is not None and not part.ok
            ]
            result.catalog_error = "; ".join(e for e in errors if e) or None
            failed = next((p for p in (result.catalog, result.thumbnails) if p and not p.ok), None)
            failure = (failed.outcome, failed.error) if failed else None
        except Exception as exc:  # noqa: BLE001 - the spend is written; the catalog is extra
            result.catalog_error = error_line(
                Outcome.OTHER,
                f"the catalog read failed ({type(exc).__name__}: {safe_text(str(exc))})",
            )
            failure = (Outcome.OTHER, result.catalog_error)
        if result.catalog_error:
            log.warning("%s catalog: %s", account, result.catalog_error)
        if request.catalog:
            self._charge_to_run(result, failure)

    def _charge_to_run(
        self, result: SyncOutcome, failure: tuple[Outcome, str | None] | None
    ) -> None:
        """Make the full catalog read's usage and failure the run's own."""
        if result.catalog is not None:
            result.api_calls += result.catalog.api_calls
            result.usage = result.usage.merge(result.catalog.usage)
            held = account_hold(result.catalog.usage)
            if held is not None:
                result.regain_at = max(filter(None, (result.regain_at, self.clock() + held)))
                result.rate_limit = result.rate_limit or result.catalog.usage.limit
        if failure is not None:
            result.outcome, result.error = failure
            if result.catalog is not None and result.catalog.rate_limit:
                result.rate_limit = result.catalog.rate_limit


class _FinishedRuns:
    """Closes a wave's finished runs' rows in batches; a refused token is marked at once."""

    BATCH = 200

    def __init__(self, warehouse: Warehouse, spend: SpendSync) -> None:
        self._warehouse = warehouse
        self._spend = spend
        self._ends: list[tuple[SyncKey, SyncRunEnd]] = []
        self._lock = threading.Lock()

    def add(self, target: Target, result: SyncOutcome) -> None:
        if result.token_rejected_by_meta:
            with self._warehouse.connect() as con:
                self._spend.mark_token(con, target, result)
        with self._lock:
            self._ends.append(self._spend.end(target, result))
            full = len(self._ends) >= self.BATCH
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            ends, self._ends = self._ends, []
            if ends:
                with self._warehouse.connect() as con:
                    finish_sync_runs(con, ends)


def _end(result: SyncOutcome, failure: Failure) -> None:
    """End a sync's outcome as failed (logged)."""
    result.outcome, result.error = failure.outcome, failure.error
    if failure.regain_at is not None:
        result.regain_at = failure.regain_at
    if failure.rate_limit is not None:
        result.rate_limit = failure.rate_limit
    log.warning("%s %s", result.request.ad_account_id, result.error)
