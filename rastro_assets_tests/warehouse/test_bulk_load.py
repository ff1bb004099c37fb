"""Arrow tables registered with the warehouse read back exactly, on both engines."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from rastro_assets.warehouse.connection import register_arrow, transaction

AWKWARD = pa.table(
    {
        "place": pa.array([1, 2, 3, 4, 5], pa.int32()),
        "note": pa.array(["plain", "", None, 'quote " comma , new\nline', "tab\t\\N é"]),
        "amount": pa.array(
            [Decimal("0.0001"), Decimal("-99999999999999.9999"), None, Decimal("12.5000"),
             Decimal("0.0000")],
            pa.decimal128(18, 4),
        ),
        "figure": pa.array([0, -(2**63), 2**63 - 1, None, 7], pa.int64()),
        "flag": pa.array([True, False, None, True, False]),
        "day": pa.array([date(2026, 11, 30), None, date(1970, 1, 1), date(2026, 2, 28),
                         date(9999, 12, 31)], pa.date32()),
        "seen_at": pa.array(
            [datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC), None,
             datetime(2026, 1, 1, tzinfo=UTC), datetime(2000, 2, 29, 12, tzinfo=UTC),
             datetime(2026, 6, 1, 3, 4, 5, 6, tzinfo=UTC)],
            pa.timestamp("us", tz="UTC"),
        ),
        "image": pa.array([b"\x00\xff", b"", None, b"\\x00", b"plain"], pa.binary()),
    }
)


@pytest.mark.engines("duckdb", "postgres")
@pytest.mark.parametrize("columns", [
    [name for name in AWKWARD.column_names if name != "image"],  # the one-pass CSV route
    AWKWARD.column_names,  # a binary column: row by row
])
def test_a_registered_table_reads_back_exactly(con, columns):
    # In chunks, the first empty: a batch whose first read has no rows.
    table = pa.concat_tables([AWKWARD.slice(0, 0), AWKWARD.slice(0, 2), AWKWARD.slice(2)])
    table = table.select(columns)
    with transaction(con):
        register_arrow(con, "incoming_awkward", table)
        stored = con.execute(
            f"SELECT {', '.join(columns)} FROM incoming_awkward ORDER BY place"
        ).fetchall()
    expected = [tuple(row[name] for name in columns) for row in table.to_pylist()]
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
            for row in stored] == expected
