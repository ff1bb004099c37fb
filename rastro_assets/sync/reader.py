"""Meta's spend answer for one account-range, as batches ready to write; it never writes.

A backfill reads dozens of chunks: writing each on its own opened the file
and checkpointed dozens of times, while one write for the whole answer would
hold it all in memory. So chunks are gathered into batches of about
`BATCH_ROWS` rows, which the caller writes as they come.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date

import pyarrow as pa

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import MetaError
from rastro_assets.meta.models import InsightsChunk
from rastro_assets.timekeeping import days_between

BATCH_ROWS = 60_000


@dataclass(frozen=True)
class SpendBatch:
    """Chunks of one read, to be written as one.

    `whole`: this batch is the read's whole answer. Such a read is small (every
    live sync), and a wave writes it together with other accounts' reads.
    """

    days: list[date]
    complete_days: list[date]
    rows: pa.Table
    whole: bool

    @classmethod
    def of(cls, chunks: list[InsightsChunk], *, whole: bool) -> SpendBatch:
        return cls(
            days=[day for chunk in chunks for day in days_between(chunk.since, chunk.until)],
            complete_days=[
                day
                for chunk in chunks
                if chunk.complete
                for day in days_between(chunk.since, chunk.until)
            ],
            rows=pa.concat_tables([chunk.table for chunk in chunks]),
            whole=whole,
        )

    @property
    def incomplete_days(self) -> list[date]:
        complete = set(self.complete_days)
        return [day for day in self.days if day not in complete]


def read_spend(
    client: MetaClient,
    ad_account_id: str,
    since: date,
    until: date,
    *,
    rows_per_day: int | None = None,
) -> Iterator[SpendBatch]:
    """Yield the account's ad-days for `since`..`until` in batches, as Meta answers.

    `rows_per_day` (the most rows a day of the account held lately) sizes the
    ranges asked of Meta. Should the read fail, the chunks read completely
    before the failure come first, as a batch that is not `whole`, and then
    the `MetaError`: what was read completely is as true as any other read.
    """
    pending: list[InsightsChunk] = []
    pending_rows = 0
    yielded = False
    try:
        for chunk in client.insights(ad_account_id, since, until, rows_per_day=rows_per_day):
            pending.append(chunk)
            pending_rows += chunk.table.num_rows
            if pending_rows >= BATCH_ROWS:
                yield SpendBatch.of(pending, whole=False)
                pending, pending_rows, yielded = [], 0, True
    except MetaError:
        if pending:
            yield SpendBatch.of(pending, whole=False)
        raise
    if pending:
        yield SpendBatch.of(pending, whole=not yielded)
