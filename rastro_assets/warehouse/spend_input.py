"""What a write to `ad_spend_daily` accepts: a read's table as `SPEND_COLUMNS`, checked first."""

from __future__ import annotations

from datetime import date

import pyarrow as pa
import pyarrow.compute as pc

from rastro_assets.meta.models import INSIGHT_SCHEMA, InsightRow, first_unrepresentable
from rastro_assets.spend_schema import SPEND_LIMIT
from rastro_assets.warehouse.errors import SpendInputError, read_columns

# The columns the writer reads, with the types it takes them in.
SPEND_COLUMNS = pa.schema(INSIGHT_SCHEMA.field(name) for name in (
    "ad_id", "day", "spend", "impressions", "clicks", "conversations"
))


def incoming_table(days: list[date], complete_days: list[date], rows: pa.Table) -> pa.Table:
    """The read as `SPEND_COLUMNS`, checked; SpendInputError when it is wrong.

    Repeated ad-days are counted by DuckDB in the writer's first query.
    """
    day_set = set(days)
    stray = [day for day in complete_days if day not in day_set]
    if stray:
        raise SpendInputError(f"complete day {stray[0].isoformat()} is not one of the days written")
    table = read_columns(rows, SPEND_COLUMNS)
    if not table.num_rows:
        return table
    ad_id, day = table["ad_id"], table["day"]
    written = pc.is_in(day, value_set=pa.array(days, pa.date32()))
    if not pc.all(written).as_py():
        outside = pc.index(written, False).as_py()
        raise SpendInputError(
            f"ad {ad_id[outside].as_py()} has a row for {day[outside].as_py()}, which is not"
            " one of the days written"
        )
    if ad_id.null_count or pc.any(pc.equal(ad_id, "")).as_py():
        raise SpendInputError("the read has a row without an ad id")
    if any(column.null_count for column in table.columns):
        raise SpendInputError(_first_unrepresentable(table) or "the read has an empty figure")
    # decimal128(18, 4) promises 18 digits, but an array built unchecked may hold more.
    extremes = pc.min_max(table["spend"])
    if extremes["min"].as_py() <= -SPEND_LIMIT or extremes["max"].as_py() >= SPEND_LIMIT:
        raise SpendInputError(_first_unrepresentable(table) or "a spend is out of range")
    return table


def _first_unrepresentable(table: pa.Table) -> str | None:
    """The refusal naming the first row that does not fit."""
    columns = [table[field.name].to_pylist() for field in SPEND_COLUMNS]
    return first_unrepresentable(list(map(InsightRow, *columns)))


def first_duplicate(table: pa.Table) -> str:
    seen: set[tuple[str, date]] = set()
    for ad_id, day in zip(table["ad_id"].to_pylist(), table["day"].to_pylist(), strict=True):
        if (ad_id, day) in seen:
            return f"ad {ad_id} on {day.isoformat()}"
        seen.add((ad_id, day))
    return "unknown"
