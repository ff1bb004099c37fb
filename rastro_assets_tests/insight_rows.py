"""Insights chunks from `InsightRow`s and back: how tests and stand-in clients build them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from rastro_assets.meta.models import InsightRow, InsightsChunk, insight_table


def chunk_from_rows(
    since: date, until: date, rows: Sequence[InsightRow], complete: bool
) -> InsightsChunk:
    """A chunk of `rows` as given (neither sorted nor deduplicated).

    Raises:
        UnrepresentableRow: a row holds a value its column cannot.
    """
    return InsightsChunk(since, until, insight_table(rows), complete)


def chunk_rows(chunk: InsightsChunk) -> list[InsightRow]:
    """The chunk's table as `InsightRow`s (spend with 4 decimal places)."""
    columns = [column.to_pylist() for column in chunk.table.columns]
    return list(map(InsightRow, *columns))
