"""The sync's spend writer: every read's batches go to the warehouse through it.

A read comes as batches (`spend_read.SpendRead`). A large one is written batch
by batch on a thread while the read goes on (`take`); a read of one batch
comes back unwritten, so that a wave writes many accounts' small reads in one
batch (`write_many`). Both routes end in the same statements: the table's
(`warehouse.ad_spend_table.write_spend_many`) for the figures, then the names
the same reads brought. Each step returns what it wrote (`SpendWritten`); it
never touches a sync's outcome, which `syncer.Syncer` folds on its own thread.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from functools import partial

from rastro_assets.outcomes import MAX_ERROR_CHARS, Outcome
from rastro_assets.sync.reader import SpendBatch
from rastro_assets.sync.spend_read import SpendRead, Target
from rastro_assets.sync.types import Failure
from rastro_assets.warehouse.ad_spend_table import (
    DaySummary,
    SpendInputError,
    SpendWrite,
    SpendWriteResult,
    write_spend_many,
)
from rastro_assets.warehouse.catalog import upsert_spend_names
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.errors import AccountNotLinked, AccountTakenOver, WriteRefusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpendWritten:
    """What a write step did for one sync, its batches added up.

    `failure` ends the sync: the warehouse refused the write, or the write broke.
    """

    rows_written: int = 0
    rows_deleted: int = 0
    changed_days: tuple[date, ...] = ()
    """Days of a batch whose write inserted, changed or deleted a row."""
    complete_days: tuple[date, ...] = ()
    incomplete_days: tuple[date, ...] = ()
    days: Mapping[date, DaySummary] = field(default_factory=dict)
    failure: Failure | None = None

    @classmethod
    def of(cls, batch: SpendBatch, answer: SpendWriteResult) -> SpendWritten:
        """What writing `batch` did, as the warehouse answered."""
        changed = answer.rows_written or answer.rows_deleted
        return cls(
            rows_written=answer.rows_written,
            rows_deleted=answer.rows_deleted,
            changed_days=tuple(batch.days) if changed else (),
            complete_days=tuple(batch.complete_days),
            incomplete_days=tuple(batch.incomplete_days),
            days=dict(answer.days),
        )

    def then(self, later: SpendWritten) -> SpendWritten:
        """This write followed by `later`, of the same read."""
        return SpendWritten(
            rows_written=self.rows_written + later.rows_written,
            rows_deleted=self.rows_deleted + later.rows_deleted,
            changed_days=self.changed_days + later.changed_days,
            complete_days=self.complete_days + later.complete_days,
            incomplete_days=self.incomplete_days + later.incomplete_days,
            days={**self.days, **later.days},
            failure=later.failure or self.failure,
        )


@dataclass(frozen=True)
class Unwritten:
    """A read that fit one batch, waiting for `SpendWriter.write_many`."""

    target: Target
    batch: SpendBatch


@dataclass
class SpendWriter:
    """Writes spend reads into one warehouse, streamed or batched."""

    warehouse: Warehouse

    def take(self, read: SpendRead) -> tuple[SpendWritten, Unwritten | None]:
        """Read `read` to its end, writing a large answer as it comes; never raises.

        Returns what was written and, for a read of one batch that went well, that
        batch unwritten, for `write_many`.
        """
        streamed = _StreamedWrites(
            partial(self._write_streamed, read.target, read.started_at),
            read.target.request.ad_account_id,
        )
        try:
            whole = self._stream(read, streamed)
        except (AccountNotLinked, AccountTakenOver, SpendInputError) as exc:
            return replace(streamed.written, failure=refusal(exc)), None
        except Exception as exc:  # noqa: BLE001 - returned as this account's failure
            # An unexpected error must still end the run's row, or the
            # account would wait out the lease; its type says where to look.
            log.exception("%s: unexpected failure", read.target.request.ad_account_id)
            return replace(streamed.written, failure=_unexpected(exc)), None
        if read.failed or whole is None:
            return streamed.written, None
        return streamed.written, Unwritten(read.target, whole)

    def write_many(self, reads: Sequence[Unwritten], synced_at: datetime) -> list[SpendWritten]:
        """Write reads of one batch each, of one account or many, in one batch.

        A live wave writes a few dozen rows for each of hundreds of accounts:
        one set of statements for all of them costs a fraction of one each.
        Each read gets its own answer, in order; a failure of the batch as a
        whole fails each read in it, and never raises.
        """
        try:
            answers = self._write_batches(
                [
                    (read.target.request.ad_account_id, read.batch, read.target.request.run_id)
                    for read in reads
                ],
                synced_at,
            )
        except Exception as exc:  # noqa: BLE001 - returned as each account's failure
            log.exception("a batch of %d accounts' writes failed", len(reads))
            return [SpendWritten(failure=_unexpected(exc)) for _ in reads]
        return [
            SpendWritten.of(read.batch, answer)
            if isinstance(answer, SpendWriteResult)
            else SpendWritten(failure=refusal(answer))
            for read, answer in zip(reads, answers, strict=True)
        ]

    @staticmethod
    def _stream(read: SpendRead, streamed: _StreamedWrites) -> SpendBatch | None:
        """Write the read's batches as they come; the whole answer of a small read comes back.

        A write's refusal stops the read and is raised.
        """
        whole = None
        try:
            with contextlib.closing(read.batches):
                for batch in read.batches:
                    if batch.whole:
                        whole = batch
                    else:
                        streamed.submit(batch)
            if read.failed:
                streamed.wait_after_failed_read()
            else:
                streamed.wait()
        finally:
            streamed.shutdown()
        return whole

    def _write_streamed(
        self, target: Target, synced_at: datetime, batch: SpendBatch
    ) -> SpendWritten:
        """One batch of a large read; the warehouse's refusal is raised."""
        request = target.request
        [answer] = self._write_batches([(request.ad_account_id, batch, request.run_id)], synced_at)
        if not isinstance(answer, SpendWriteResult):
            raise answer
        return SpendWritten.of(batch, answer)

    def _write_batches(
        self, reads: Sequence[tuple[str, SpendBatch, str | None]], synced_at: datetime
    ) -> list[SpendWriteResult | WriteRefusal]:
        """The one spend write: the figures, then the names the same reads brought.

        Names are kept as they arrive: an ad is named long before the daily
        catalog read, and even if that read fails.
        """
        writes = [
            SpendWrite(account, batch.days, batch.rows, batch.complete_days, run_id)
            for account, batch, run_id in reads
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


class _StreamedWrites:
    """Writes one large read's batches on a thread while the read goes on.

    DuckDB, and psycopg while the server works, release the GIL, so a batch
    is written while the next pages download and parse; one write in flight
    at most bounds memory. The warehouse is opened only for a batch's write,
    never across a Meta call. The thread only writes and returns what it
    wrote; `written` adds it up on the thread that reads.
    """

    def __init__(self, write: Callable[[SpendBatch], SpendWritten], ad_account_id: str) -> None:
        self._write = write
        self._ad_account_id = ad_account_id
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: Future[SpendWritten] | None = None
        self.written = SpendWritten()

    def submit(self, batch: SpendBatch) -> None:
        """Write `batch` after the write in flight; a write's error is raised here or by `wait`."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rastro-spend-writer")
        self._in_flight = self._executor.submit(self._write, batch)

    def wait(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            self.written = self.written.then(in_flight.result())

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


def _unexpected(exc: Exception) -> Failure:
    return Failure.of(Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync")


def refusal(exc: WriteRefusal) -> Failure:
    """How the warehouse's refusal of a sync's write ends the sync."""
    if isinstance(exc, AccountTakenOver):
        # The contract's code for a run that lost its hold on the account.
        return Failure(Outcome.OTHER, f"RUN_TIMEOUT: {exc}"[:MAX_ERROR_CHARS])
    if isinstance(exc, AccountNotLinked):
        return Failure.of(Outcome.OTHER, "the account was unlinked during the sync; nothing kept")
    return Failure.of(Outcome.OTHER, f"Meta sent figures the warehouse cannot hold: {exc}")
