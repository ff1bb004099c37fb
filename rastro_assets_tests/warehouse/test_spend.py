"""The spend writer: replace account-days exactly, reconcile complete days, keep sites in step."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rastro_assets.meta.models import InsightRow, UnrepresentableRow, insight_table
from rastro_assets.spend_schema import SPEND_TYPE
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.ad_spend_table import (
    DaySummary,
    SpendInputError,
    spend_by_day,
    write_spend,
)
from rastro_assets.warehouse.connection import Warehouse, transaction
from rastro_assets.warehouse.errors import AccountNotLinked
from rastro_assets.warehouse.site_spend import rebuild_site_spend
from rastro_assets_tests.warehouse.assertions import (
    assert_site_spend_exact,
    site_rows,
    spend_rows,
    synced_at,
)
from rastro_assets_tests.warehouse.spend_reads import D1, D2, D3, DAYS, ad_days, row


def write(con, rows, *, days=None, complete=None, at: datetime, account: str = "act_1"):
    """Write `InsightRow`s, as the tests have them, through the table the writer takes."""
    days = sorted({r.day for r in rows}) if days is None else days
    return write_spend(
        con,
        account,
        days=days,
        rows=insight_table(rows),
        complete_days=days if complete is None else complete,
        synced_at=at,
    )


READ = [
    row("a1", D1, "10.5000"),
    row("a2", D1, "0.0001", 1, 0, 0),
    row("a1", D2, "7.25"),
    row("a3", D2, "100", 5000, 40, 2),
]


def test_first_write_inserts_everything(con, now, linked_account):
    result = write(con, READ, at=now)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (4, 0, 0)
    assert result.days == {
        D1: DaySummary(Decimal("10.5001"), 2),
        D2: DaySummary(Decimal("107.2500"), 2),
    }
    assert spend_rows(con) == [
        ("act_1", "a1", D1, Decimal("10.5000"), 100, 3, 1),
        ("act_1", "a1", D2, Decimal("7.2500"), 100, 3, 1),
        ("act_1", "a2", D1, Decimal("0.0001"), 1, 0, 0),
        ("act_1", "a3", D2, Decimal("100.0000"), 5000, 40, 2),
    ]
    assert set(synced_at(con).values()) == {now}
    assert_site_spend_exact(con)


def test_the_same_read_twice_changes_no_figure(con, now, linked_account):
    write(con, READ, at=now)
    figures, sites = spend_rows(con), site_rows(con)
    later = now + timedelta(hours=1)
    result = write(con, READ, at=later)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (0, 0, 4)
    assert spend_rows(con) == figures
    assert site_rows(con) == sites
    assert set(synced_at(con).values()) == {later}
    assert_site_spend_exact(con)


def test_changed_figures_are_counted_as_written(con, now, linked_account):
    write(con, READ, at=now)
    changed = [
        row("a1", D1, "10.5001"),
        READ[1],
        row("a1", D2, "7.25", clicks=4),
        READ[3],
        row("a4", D2, "1"),
    ]
    result = write(con, changed, at=now)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (3, 0, 2)
    assert result.days[D2] == DaySummary(Decimal("108.2500"), 3)
    assert_site_spend_exact(con)


def test_complete_day_drops_ads_missing_from_the_read(con, now, linked_account):
    write(con, READ, at=now)
    result = write(con, [row("a1", D1, "10.5")], days=[D1, D2], complete=[D1, D2], at=now)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (0, 3, 1)
    assert [(r[1], r[2]) for r in spend_rows(con)] == [("a1", D1)]
    assert result.days == {D1: DaySummary(Decimal("10.5000"), 1), D2: DaySummary(Decimal("0"), 0)}
    assert [(r[0], r[2]) for r in site_rows(con)] == [("s1", D1)]
    assert_site_spend_exact(con)


def test_partial_day_keeps_ads_missing_from_the_read(con, now, linked_account):
    write(con, READ, at=now)
    result = write(con, [row("a1", D2, "8")], days=[D1, D2], complete=[D1], at=now)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (1, 2, 0)
    assert [(r[1], r[2], r[3]) for r in spend_rows(con)] == [
        ("a1", D2, Decimal("8.0000")),
        ("a3", D2, Decimal("100.0000")),
    ]
    assert result.days[D2] == DaySummary(Decimal("108.0000"), 2)
    assert D1 not in {r[2] for r in site_rows(con)}
    assert_site_spend_exact(con)


def test_synced_at_moves_only_on_rows_the_read_brought(con, now, linked_account):
    write(con, [*READ, row("a4", D1, "3"), row("a4", D2, "4")], at=now)
    later = now + timedelta(hours=1)
    # D1 complete: a2 gone, a1 and a4 unchanged. D2 partial: a1 unchanged, a3 changed,
    # a4 not read (kept, stamp untouched); a5 new.
    result = write(
        con,
        [row("a1", D1, "10.5"), row("a4", D1, "3"), row("a1", D2, "7.25"),
         row("a3", D2, "101", 5000, 40, 2), row("a5", D2, "1")],
        days=[D1, D2], complete=[D1], at=later,
    )
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (2, 1, 3)
    assert synced_at(con) == {
        ("act_1", "a1", D1): later,
        ("act_1", "a4", D1): later,
        ("act_1", "a1", D2): later,
        ("act_1", "a3", D2): later,
        ("act_1", "a4", D2): now,
        ("act_1", "a5", D2): later,
    }
    assert_site_spend_exact(con)


def test_an_empty_partial_read_changes_nothing(con, now, linked_account):
    write(con, READ, at=now)
    before = spend_rows(con)
    result = write(con, [], days=[D1, D2, D3], complete=[], at=now)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (0, 0, 0)
    assert spend_rows(con) == before
    assert result.days[D3] == DaySummary(Decimal("0"), 0)
    assert_site_spend_exact(con)


def test_other_accounts_and_days_are_untouched(con, now, linked_account):
    link_store.link_account(con, "s1", "act_2", "c1", "UTC", "USD", now)
    write(con, READ, at=now)
    write(con, [row("a1", D1, "9"), row("a1", D3, "1")], at=now, account="act_2")
    write(con, [], days=[D1], complete=[D1], at=now)
    assert {(r[0], r[2]) for r in spend_rows(con)} == {
        ("act_1", D2),
        ("act_2", D1),
        ("act_2", D3),
    }
    assert_site_spend_exact(con)


def test_two_sites_sharing_an_account(con, now, linked_account):
    site_store.add_site(con, "s2", "Two", now)
    link_store.link_account(con, "s2", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    write(con, READ, at=now)
    assert_site_spend_exact(con)
    write(con, [row("a9", D1, "0.0003")], days=[D1], at=now)
    assert_site_spend_exact(con)
    rows = site_rows(con)
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("s1", D1, Decimal("0.0003")),
        ("s1", D2, Decimal("107.2500")),
        ("s2", D1, Decimal("0.0003")),
        ("s2", D2, Decimal("107.2500")),
    ]


@pytest.mark.parametrize(
    "values",
    [
        ["0.0001", "0.0001", "0.0001"],
        ["12345678901234.5678", "0.0001"],
        ["1234", "5678", "1"],
        ["99999999999999.9999"],
        ["0.1", "0.2", "0.3000"],
        ["1.10", "2.200", "3.3000"],
        ["0", "0.0000"],
    ],
)
def test_money_is_exact(con, now, linked_account, values):
    rows = [row(f"a{i}", D1, value) for i, value in enumerate(values)]
    result = write(con, rows, at=now)
    total = sum(Decimal(value) for value in values)
    assert result.days[D1].spend == total
    stored = con.execute("SELECT spend FROM ad_spend_daily ORDER BY ad_id").fetchall()
    assert [value for (value,) in stored] == [Decimal(v) for v in values]
    assert site_rows(con)[0][3] == total
    assert_site_spend_exact(con)


REFUSED = [
    ([row("a1", D1, "0.00001")], "more than 4 decimal places"),
    ([row("a1", D1, "100000000000000")], "too large for DECIMAL"),
    ([row("a1", D1, "-100000000000000.5")], "too large for DECIMAL"),
    ([InsightRow("a1", D1, Decimal("NaN"), 1, 1, 1)], "is not a number"),
    ([InsightRow("a1", D1, Decimal("Infinity"), 1, 1, 1)], "is not a number"),
    ([InsightRow("a1", D1, 1.5, 1, 1, 1)], "is not a Decimal"),
    ([InsightRow("a1", D1, "1.5", 1, 1, 1)], "is not a Decimal"),
    ([InsightRow("a1", D1, Decimal(1), None, 1, 1)], "impressions None"),
    ([InsightRow("a1", D1, Decimal(1), 1, 2**63, 1)], "clicks"),
    ([InsightRow("a1", D1, Decimal(1), 1, 1, "2")], "conversations"),
    ([InsightRow("", D1, Decimal(1), 1, 1, 1)], "without an ad id"),
    ([InsightRow(None, D1, Decimal(1), 1, 1, 1)], "without an ad id"),
    ([row("a1", D1, "1"), row("a1", D1, "1")], "repeats an ad-day: ad a1 on 2026-11-27"),
    ([row("a1", D3, "1")], "not one of the days written"),
]


@pytest.mark.parametrize(("rows", "message"), REFUSED)
def test_refused_reads_write_nothing(con, now, linked_account, rows, message):
    write(con, READ, at=now)
    before, sites = spend_rows(con), site_rows(con)
    # A row no Arrow column can hold is refused building the table, the rest by the writer.
    with pytest.raises((SpendInputError, UnrepresentableRow), match=message):
        write(con, [row("a7", D1, "1"), *rows], days=[D1, D2], complete=[D1, D2], at=now)
    assert spend_rows(con) == before
    assert site_rows(con) == sites
    assert set(synced_at(con).values()) == {now}


def _spoiled(table: pa.Table, column: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(column), column, values)


def _unchecked_spend(value: str) -> pa.Array:
    """A decimal128(18, 4) array holding more digits than the type allows."""
    return pa.array([Decimal("1"), Decimal(value)], pa.decimal128(38, 4)).cast(
        SPEND_TYPE, safe=False
    )


TABLE = insight_table([row("a7", D1, "1"), row("a1", D1, "2")])
TABLE_REFUSED = [
    (TABLE.drop_columns(["clicks"]), "the read has no 'clicks' column"),
    (_spoiled(TABLE, "spend", TABLE["spend"].cast(pa.decimal128(38, 6))),
     r"the read's 'spend' column is decimal128\(38, 6\), not decimal128\(18, 4\)"),
    (_spoiled(TABLE, "spend", pa.array([1.0, 2.0])), "'spend' column is double"),
    (_spoiled(TABLE, "impressions", pa.array([1, None], pa.int64())),
     "ad a1 on 2026-11-27: impressions None is not a 64-bit integer"),
    (_spoiled(TABLE, "spend", pa.array([Decimal(1), None], SPEND_TYPE)),
     "ad a1 on 2026-11-27: spend None is not a Decimal"),
    (_spoiled(TABLE, "spend", _unchecked_spend("100000000000000")),
     r"ad a1 on 2026-11-27: spend 100000000000000.0000 is too large for DECIMAL\(18,4\)"),
    (_spoiled(TABLE, "spend", _unchecked_spend("-100000000000000")), "too large for DECIMAL"),
    (_spoiled(TABLE, "ad_id", pa.array(["a7", ""])), "without an ad id"),
    (_spoiled(TABLE, "ad_id", pa.array(["a7", None], pa.string())), "without an ad id"),
    (_spoiled(TABLE, "ad_id", pa.array(["a1", "a1"])), "repeats an ad-day: ad a1 on 2026-11-27"),
    (_spoiled(TABLE, "day", pa.array([D1, D3])),
     "ad a1 has a row for 2026-11-29, which is not one of the days written"),
    (_spoiled(TABLE, "day", pa.array([D1, None], pa.date32())),
     "ad a1 has a row for None, which is not one of the days written"),
]


@pytest.mark.parametrize(("table", "message"), TABLE_REFUSED)
def test_refused_tables_write_nothing(con, now, linked_account, table, message):
    write(con, READ, at=now)
    before, sites = spend_rows(con), site_rows(con)
    with pytest.raises(SpendInputError, match=message):
        write_spend(con, "act_1", days=[D1, D2], rows=table, complete_days=[D1, D2],
                    synced_at=now)
    assert spend_rows(con) == before
    assert site_rows(con) == sites


def test_a_table_writes_as_its_rows_do(con, now, linked_account):
    chunked = pa.concat_tables([insight_table(READ[:1]), insight_table(READ[1:])])
    extra = chunked.append_column("note", pa.array(["x"] * len(READ)))
    result = write_spend(con, "act_1", days=[D1, D2], rows=extra, complete_days=[D1, D2],
                         synced_at=now)
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (4, 0, 0)
    assert result.days == write(con, READ, at=now).days
    assert pc.sum(insight_table(READ)["spend"]).as_py() == sum(r.spend for r in READ)
    assert_site_spend_exact(con)


def test_complete_days_must_be_days_written(con, now, linked_account):
    with pytest.raises(SpendInputError, match="complete day 2026-11-29"):
        write(con, READ, days=[D1, D2], complete=[D3], at=now)
    assert spend_rows(con) == []


def test_synced_at_must_be_aware(con, linked_account):
    with pytest.raises(SpendInputError, match="aware"):
        write(con, READ, at=datetime(2026, 1, 1))


def test_an_unlinked_account_gets_nothing(con, now, linked_account):
    with pytest.raises(AccountNotLinked, match="act_9"):
        write(con, READ, at=now, account="act_9")
    link_store.unlink_account(con, "s1", "act_1")
    with pytest.raises(AccountNotLinked):
        write(con, READ, at=now)
    assert spend_rows(con) == []
    assert site_rows(con) == []


def test_unlink_during_a_run_leaves_nothing_behind(warehouse: Warehouse, now, linked_account):
    with warehouse.connect() as other:
        link_store.unlink_account(other, "s1", "act_1")
    with warehouse.connect() as con, pytest.raises(AccountNotLinked):
        write(con, READ, at=now)
    with warehouse.connect() as con:
        assert spend_rows(con) == []


def test_the_writer_joins_an_outer_transaction(con, now, linked_account):
    with pytest.raises(RuntimeError), transaction(con):
        write(con, READ, at=now)
        assert len(spend_rows(con)) == 4
        raise RuntimeError("the sync failed afterwards")
    assert spend_rows(con) == []
    assert site_rows(con) == []


def test_no_days_is_a_no_op(con, now, linked_account):
    result = write(con, [], days=[], at=now)
    assert result.days == {}
    assert (result.rows_written, result.rows_deleted, result.rows_unchanged) == (0, 0, 0)


def test_spend_by_day_lists_every_day(con, now, linked_account):
    write(con, READ, at=now)
    assert spend_by_day(con, "act_1", D1, D3) == {
        D1: DaySummary(Decimal("10.5001"), 2),
        D2: DaySummary(Decimal("107.2500"), 2),
        D3: DaySummary(Decimal("0"), 0),
    }
    assert spend_by_day(con, "act_1", D3, D1) == {}


def test_rebuild_repairs_a_damaged_site_table(con, now, linked_account):
    site_store.add_site(con, "s2", None, now)
    link_store.link_account(con, "s2", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    write(con, READ, at=now)
    con.execute("UPDATE site_spend_daily SET spend = spend + 1 WHERE site_id = 's1'")
    con.execute("DELETE FROM site_spend_daily WHERE site_id = 's2' AND day = ?", [D2])
    con.execute("INSERT INTO site_spend_daily VALUES ('s1', 'act_1', ?, 5, 5, 5, 5, 1)", [D3])
    rebuild_site_spend(con, "act_1", [D1])
    with pytest.raises(AssertionError):
        assert_site_spend_exact(con)
    rebuild_site_spend(con, "act_1")
    assert_site_spend_exact(con)


# a model of the writer, against random sequences of reads ----------------------

reads = st.tuples(
    st.sets(st.sampled_from(DAYS), min_size=1), st.sets(st.sampled_from(DAYS)), ad_days
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=st.lists(reads, min_size=1, max_size=4), second_site=st.booleans())
def test_writer_matches_a_model(warehouse, sequence, second_site):
    at = datetime(2026, 12, 1, tzinfo=UTC)
    model: dict[tuple[str, date], tuple] = {}
    with warehouse.connect() as con:
        # Each example starts from the same warehouse emptied: a new one each is slow.
        for table in ("ad_spend_daily", "site_spend_daily", "site_ad_accounts", "sites"):
            con.execute(f"DELETE FROM {table}")
        site_store.add_site(con, "s1", None, at)
        site_store.add_site(con, "s2", None, at)
        registry.save_connection(con, "c1", b"\0" * 40, at)
        link_store.link_account(con, "s1", "act_1", "c1", "UTC", "USD", at)
        if second_site:
            link_store.link_account(con, "s2", "act_1", "c1", "UTC", "USD", at)
        for days, complete, read in sequence:
            complete = complete & days
            rows = [
                InsightRow(ad, day, *figures) for (ad, day), figures in read.items() if day in days
            ]
            incoming = {
                (r.ad_id, r.day): (r.spend, r.impressions, r.clicks, r.conversations) for r in rows
            }
            doomed = [key for key in model if key[1] in complete and key not in incoming]
            changed = [key for key, figures in incoming.items() if model.get(key) != figures]
            result = write_spend(
                con, "act_1", days=days, rows=insight_table(rows),
                complete_days=complete, synced_at=at,
            )
            for key in doomed:
                del model[key]
            model.update(incoming)
            assert result.rows_deleted == len(doomed)
            assert result.rows_written == len(changed)
            assert result.rows_unchanged == len(rows) - len(changed)
            assert spend_rows(con) == sorted(
                ("act_1", ad, day, *figures) for (ad, day), figures in model.items()
            )
            for day in days:
                on_day = [figures[0] for (_, d), figures in model.items() if d == day]
                assert result.days[day] == DaySummary(sum(on_day, Decimal(0)), len(on_day))
            assert_site_spend_exact(con)


def test_the_writer_copes_with_a_half_read_result(con, now, linked_account):
    with transaction(con):
        con.execute("SELECT * FROM generate_series(1, 10)").fetchone()
        write(con, READ, at=now)
    con.execute("BEGIN TRANSACTION")
    con.execute("SELECT * FROM generate_series(1, 10)").fetchone()
    write(con, READ, at=now)
    con.execute("COMMIT")
    assert len(spend_rows(con)) == 4
