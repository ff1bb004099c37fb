"""Many accounts' reads in one batch write exactly what writing each alone writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rastro_assets.meta.models import InsightRow, insight_table
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.spend import (
    AccountNotLinked,
    SpendInputError,
    SpendWrite,
    write_spend,
    write_spend_many,
)
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact, site_rows, spend_rows
from rastro_assets_tests.warehouse.test_spend import ADS, DAYS, ad_days, row

ACCOUNTS = ["act_1", "act_2", "act_3"]
AT = datetime(2026, 12, 1, tzinfo=UTC)

account_reads = st.tuples(
    st.sampled_from(ACCOUNTS),
    st.sets(st.sampled_from(DAYS), min_size=1),
    st.sets(st.sampled_from(DAYS)),
    ad_days,
)
waves = st.lists(account_reads, min_size=1, max_size=3, unique_by=lambda read: read[0])


def linked_warehouse(path, second_site: bool) -> Warehouse:
    warehouse = Warehouse(path)
    with warehouse.connect() as con:
        registry.add_site(con, "s1", None, AT)
        registry.add_site(con, "s2", None, AT)
        registry.save_connection(con, "c1", b"\0" * 40, AT)
        for account in ACCOUNTS[:2]:  # act_3 stays unlinked
            registry.link_account(con, "s1", account, "c1", "UTC", "USD", AT)
        if second_site:
            registry.link_account(con, "s2", "act_1", "c1", "UTC", "USD", AT)
    return warehouse


def as_write(read, as_table: bool) -> SpendWrite:
    account, days, complete, figures = read
    rows = [InsightRow(ad, day, *values) for (ad, day), values in figures.items() if day in days]
    return SpendWrite(account, days, insight_table(rows) if as_table else rows, complete & days)


def alone(con, write: SpendWrite, at: datetime):
    try:
        return write_spend(
            con, write.ad_account_id, days=write.days, rows=write.rows,
            complete_days=write.complete_days, synced_at=at,
        )
    except (SpendInputError, AccountNotLinked) as exc:
        return exc


def same_answer(batch, single) -> bool:
    if isinstance(single, Exception):
        return type(batch) is type(single) and str(batch) == str(single)
    return batch == single


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=st.lists(waves, min_size=1, max_size=4), second_site=st.booleans(),
       as_table=st.booleans())
def test_a_batch_writes_what_each_write_alone_writes(
    tmp_path_factory, sequence, second_site, as_table
):
    directory = tmp_path_factory.mktemp("many")
    batched = linked_warehouse(directory / "batched.duckdb", second_site)
    single = linked_warehouse(directory / "single.duckdb", second_site)
    with batched.connect() as batch_con, single.connect() as single_con:
        for number, wave in enumerate(sequence):
            at = AT + timedelta(hours=number)
            writes = [as_write(read, as_table) for read in wave]
            answers = write_spend_many(batch_con, writes, synced_at=at)
            expected = [alone(single_con, write, at) for write in writes]
            assert all(map(same_answer, answers, expected)), (answers, expected)
            assert spend_rows(batch_con) == spend_rows(single_con)
            assert site_rows(batch_con) == site_rows(single_con)
            assert_site_spend_exact(batch_con)


def test_a_refused_read_leaves_the_batch_written(tmp_path):
    warehouse = linked_warehouse(tmp_path / "w.duckdb", second_site=True)
    day = DAYS[0]
    good = SpendWrite("act_1", [day], [row("a1", day, "1.5"), row("a2", day, "2")], [day])
    repeated = SpendWrite("act_2", [day], [row("a1", day, "1"), row("a1", day, "2")], [day])
    unlinked = SpendWrite("act_3", [day], [row("a9", day, "3")], [day])
    with warehouse.connect() as con:
        ok, refused, not_linked = write_spend_many(
            con, [good, repeated, unlinked], synced_at=AT
        )
        assert ok.rows_written == 2 and ok.days[day].rows == 2
        assert isinstance(refused, SpendInputError) and "a1" in str(refused)
        assert isinstance(not_linked, AccountNotLinked)
        assert {(account, ad) for account, ad, *_ in spend_rows(con)} == {
            ("act_1", "a1"), ("act_1", "a2")
        }
        assert_site_spend_exact(con)


def test_a_day_whose_sums_overflow_fails_only_its_account(tmp_path):
    warehouse = linked_warehouse(tmp_path / "w.duckdb", second_site=False)
    day = DAYS[1]
    huge = [row(ad, day, "99999999999999.9999") for ad in ADS[:2]]
    writes = [
        SpendWrite("act_1", [day], [row("a1", day, "4.25")], [day]),
        SpendWrite("act_2", [day], huge, [day]),
    ]
    with warehouse.connect() as con:
        ok, overflow = write_spend_many(con, writes, synced_at=AT)
        assert ok.rows_written == 1
        assert isinstance(overflow, SpendInputError) and "spend" in str(overflow)
        assert [account for account, *_ in spend_rows(con)] == ["act_1"]
        assert_site_spend_exact(con)


def test_no_writes_is_a_no_op(tmp_path):
    warehouse = linked_warehouse(tmp_path / "w.duckdb", second_site=False)
    with warehouse.connect() as con:
        assert write_spend_many(con, [], synced_at=AT) == []
        assert write_spend_many(
            con, [SpendWrite("act_1", [], [], [])], synced_at=AT
        )[0].rows_written == 0

