"""The one spend writer of the sync: every read's batches go to the warehouse through it.

A read comes as batches (`spend.SpendRead`). A large one is written batch by
batch on a thread while the read goes on (`take`); a read of one batch comes
back unwritten, so that a wave writes many accounts' small reads in one batch
(`write_many`). Both routes end in the same statements (`_write_batches`):
`write_spend_many` for the figures, then the names the same reads brought.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from rastro_assets.meta.limits import account_hold
from rastro_assets.outcomes import MAX_ERROR_CHARS, Outcome
from rastro_assets.sync.reader import SpendBatch
from rastro_assets.sync.spend_read import SpendRead, Target
from rastro_assets.sync.types import SyncOutcome, fail
from rastro_assets.timekeeping import Clock
from rastro_assets.warehouse.ad_spend_table import (
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
class Unwritten:
    """A read that fit one batch, with its outcome, waiting for `SpendWriter.write_many`."""

    target: Target
    result: SyncOutcome
    batch: SpendBatch


@dataclass
class SpendWriter:
    """Writes spend reads into one warehouse, streamed or batched."""

    warehouse: Warehouse
    clock: Clock

    def take(self, read: SpendRead) -> Unwritten | None:
        """Read `read` to its end, writing a large answer as it comes; never raises.

        A read of one batch comes back unwritten, for `write_many`; any other
        read is written here, and its outcome completed.
        """
        result = read.result
        try:
            whole = self._stream(read)
        except Exception as exc:  # noqa: BLE001 - recorded as this account's failure
            # An unexpected error must still end the run's row, or the
            # account would wait out the lease; its type says where to look.
            log.exception("%s: unexpected failure", result.request.ad_account_id)
            fail(result, Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync")
            return None
        if not result.ok:
            return None
        if whole is None:
            note_incomplete(result)
            return None
        return Unwritten(read.target, result, whole)

    def write_many(self, reads: Sequence[Unwritten], synced_at: datetime) -> None:
        """Write reads of one batch each, of one account or many, in one batch.

        A live wave writes a few dozen rows for each of hundreds of accounts:
        one set of statements for all of them costs a fraction of one each.
        Each outcome gets its own answer; a failure of the batch as a whole
        fails each sync in it, and never raises.
        """
        try:
            answers = self._write_batches(
                [
                    (read.target.request.ad_account_id, read.batch, read.target.request.run_id)
                    for read in reads
                ],
                synced_at,
            )
        except Exception as exc:  # noqa: BLE001 - recorded as each account's failure
            log.exception("a batch of %d accounts' writes failed", len(reads))
            for read in reads:
                if read.result.ok:
                    fail(read.result, Outcome.OTHER, f"unexpected {type(exc).__name__} in the sync")
            return
        for read, answer in zip(reads, answers, strict=True):
            if isinstance(answer, SpendWriteResult):
                record(read.result, read.batch, answer)
                note_incomplete(read.result)
            else:
                refuse(read.result, answer)

    def _stream(self, read: SpendRead) -> SpendBatch | None:
        """Write the read's batches as they come; the whole answer of a small read comes back."""
        result = read.result
        streamed = _StreamedWrites(self, result.request.ad_account_id, result.started_at, result)
        whole = None
        try:
            with contextlib.closing(read.batches):
                for batch in read.batches:
                    if batch.whole:
                        whole = batch
                    else:
                        streamed.submit(batch)
            if result.ok:
                streamed.wait()
            else:
                streamed.wait_after_failed_read()
        except (AccountNotLinked, AccountTakenOver, SpendInputError) as exc:
            refuse(result, exc)
        finally:
            streamed.shutdown()
        held = account_hold(result.usage) if result.ok else None
        if held is not None:
            result.regain_at = self.clock() + held
            result.rate_limit = result.rate_limit or result.usage.limit
        return whole

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
    never across a Meta call.
    """

    def __init__(
        self, writer: SpendWriter, ad_account_id: str, synced_at: datetime, result: SyncOutcome
    ) -> None:
        self._writer = writer
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
        [answer] = self._writer._write_batches(
            [(self._ad_account_id, batch, self._result.request.run_id)], self._synced_at
        )
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


def refuse(result: SyncOutcome, exc: WriteRefusal) -> None:
    """End the sync with the reason the warehouse refused its write."""
    if isinstance(exc, AccountTakenOver):
        # The contract's code for a run that lost its hold on the account.
        result.outcome = Outcome.OTHER
        result.error = f"RUN_TIMEOUT: {exc}"[:MAX_ERROR_CHARS]
        log.warning("%s %s", result.request.ad_account_id, result.error)
    elif isinstance(exc, AccountNotLinked):
        fail(result, Outcome.OTHER, "the account was unlinked during the sync; nothing kept")
    else:
        fail(result, Outcome.OTHER, f"Meta sent figures the warehouse cannot hold: {exc}")
