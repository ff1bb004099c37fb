"""The spend writer given many accounts' reads: one batch, an answer per read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rastro_assets.meta.models import InsightRow, insight_table
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.ad_spend_table import (
    DaySummary,
    SpendInputError,
    SpendWrite,
    SpendWriteResult,
    write_spend_many,
)
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.engines import AnyWarehouse
from rastro_assets.warehouse.errors import AccountNotLinked
from rastro_assets_tests.warehouse.assertions import (
    assert_site_spend_exact,
    site_rows,
    spend_rows,
    synced_at,
)
from rastro_assets_tests.warehouse.spend_reads import ADS, DAYS, ad_days, row

ACCOUNTS = ["act_1", "act_2", "act_3"]
AT = datetime(2026, 12, 1, tzinfo=UTC)


def linked_warehouse(warehouse: AnyWarehouse, second_site: bool) -> AnyWarehouse:
    """`warehouse` with act_1 and act_2 linked to s1 (act_1 to s2 too when `second_site`),
    act_3 unlinked, and no spend: a hypothesis example starts from it again."""
    with warehouse.connect() as con:
        con.execute("DELETE FROM ad_spend_daily")
        con.execute("DELETE FROM site_spend_daily")
        con.execute("DELETE FROM site_ad_accounts WHERE site_id = 's2'")
        if con.execute("SELECT count(*) FROM sites").fetchone()[0] == 0:
            site_store.add_site(con, "s1", None, AT)
            site_store.add_site(con, "s2", None, AT)
            registry.save_connection(con, "c1", b"\0" * 40, AT)
            for account in ACCOUNTS[:2]:  # act_3 stays unlinked
                link_store.link_account(con, "s1", account, "c1", "UTC", "USD", AT)
        if second_site:
            link_store.link_account(con, "s2", "act_1", "c1", "UTC", "USD", AT)
    return warehouse


def write(account: str, days, rows: list[InsightRow], complete=None) -> SpendWrite:
    return SpendWrite(account, days, insight_table(rows), days if complete is None else complete)


# a model of the writer, many accounts at a time ----------------------------------

account_reads = st.tuples(
    st.sampled_from(ACCOUNTS),
    st.sets(st.sampled_from(DAYS), min_size=1),
    st.sets(st.sampled_from(DAYS)),
    ad_days,
)
waves = st.lists(account_reads, min_size=1, max_size=3, unique_by=lambda read: read[0])


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=st.lists(waves, min_size=1, max_size=3), second_site=st.booleans())
def test_batches_match_a_model_of_every_account(warehouse, sequence, second_site):
    warehouse = linked_warehouse(warehouse, second_site)
    model: dict[tuple[str, str, object], tuple] = {}
    with warehouse.connect() as con:
        for number, wave in enumerate(sequence):
            at = AT + timedelta(hours=number)
            writes = []
            for account, days, complete, figures in wave:
                rows = [InsightRow(ad, day, *values)
                        for (ad, day), values in figures.items() if day in days]
                writes.append(write(account, days, rows, complete & days))
            answers = write_spend_many(con, writes, synced_at=at)
            for (account, days, complete, figures), answer in zip(wave, answers, strict=True):
                complete = complete & days
                if account == "act_3":
                    assert isinstance(answer, AccountNotLinked)
                    continue
                incoming = {(account, ad, day): values
                            for (ad, day), values in figures.items() if day in days}
                gone = [key for key in model
                        if key[0] == account and key[2] in complete and key not in incoming]
                changed = [key for key, values in incoming.items() if model.get(key) != values]
                for key in gone:
                    del model[key]
                model.update(incoming)
                assert isinstance(answer, SpendWriteResult)
                assert (answer.rows_written, answer.rows_deleted, answer.rows_unchanged) == (
                    len(changed), len(gone), len(incoming) - len(changed))
                for day in days:
                    on_day = [v[0] for (a, _, d), v in model.items() if (a, d) == (account, day)]
                    assert answer.days[day] == DaySummary(sum(on_day), len(on_day))
            assert spend_rows(con) == sorted((*key, *values) for key, values in model.items())
            assert_site_spend_exact(con)


# refusals stay with their read --------------------------------------------------

def test_a_refused_read_leaves_the_batch_written(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=True)
    day = DAYS[0]
    good = write("act_1", [day], [row("a1", day, "1.5"), row("a2", day, "2")])
    repeated = write("act_2", [day], [row("a1", day, "1"), row("a1", day, "2")])
    unlinked = write("act_3", [day], [row("a9", day, "3")])
    stray = write("act_2", [day], [row("a1", DAYS[1], "1")])
    with warehouse.connect() as con:
        ok, refused, not_linked = write_spend_many(
            con, [good, repeated, unlinked], synced_at=AT
        )
        assert ok.rows_written == 2 and ok.days[day].rows == 2
        assert isinstance(refused, SpendInputError)
        assert str(refused) == f"the read repeats an ad-day: ad a1 on {day.isoformat()}"
        assert isinstance(not_linked, AccountNotLinked)
        assert str(not_linked) == "act_3 is not linked to any site (any more): nothing written"
        [answer] = write_spend_many(con, [stray], synced_at=AT)
        assert isinstance(answer, SpendInputError) and "not one of the days written" in str(answer)
        assert {(account, ad) for account, ad, *_ in spend_rows(con)} == {
            ("act_1", "a1"), ("act_1", "a2")
        }
        assert_site_spend_exact(con)


def test_a_day_whose_sums_overflow_fails_only_its_account(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=False)
    day = DAYS[1]
    huge = [row(ad, day, "99999999999999.9999") for ad in ADS[:2]]
    writes = [write("act_1", [day], [row("a1", day, "4.25")]), write("act_2", [day], huge)]
    with warehouse.connect() as con:
        ok, overflow = write_spend_many(con, writes, synced_at=AT)
        assert ok.rows_written == 1
        assert isinstance(overflow, SpendInputError)
        assert str(overflow).startswith(f"act_2 on {day.isoformat()}: the spend of its ads sums")
        assert [account for account, *_ in spend_rows(con)] == ["act_1"]
        assert_site_spend_exact(con)


def test_an_overflow_alone_is_its_writes_error(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=False)
    day = DAYS[1]
    huge = [row(ad, day, "99999999999999.9999") for ad in ADS[:2]]
    with warehouse.connect() as con:
        [overflow] = write_spend_many(con, [write("act_2", [day], huge)], synced_at=AT)
        assert isinstance(overflow, SpendInputError) and "site_spend_daily.spend" in str(overflow)
        assert spend_rows(con) == []


# the shape of a batch -----------------------------------------------------------

def test_a_first_write_and_a_rewrite_share_a_batch(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=True)
    d1, d2 = DAYS[:2]
    with warehouse.connect() as con:
        write_spend_many(con, [write("act_1", [d1], [row("a1", d1, "1"), row("a2", d1, "2")])],
                         synced_at=AT)
        later = AT + timedelta(hours=1)
        old, new = write_spend_many(con, [
            write("act_1", [d1], [row("a1", d1, "1")]),
            write("act_2", [d1, d2], [row("a1", d1, "5"), row("a1", d2, "6")]),
        ], synced_at=later)
        assert (old.rows_written, old.rows_deleted, old.rows_unchanged) == (0, 1, 1)
        assert (new.rows_written, new.rows_deleted, new.rows_unchanged) == (2, 0, 0)
        assert new.days[d2].spend == 6
        assert set(synced_at(con).values()) == {later}
        assert_site_spend_exact(con)
        assert len(site_rows(con)) == 4  # act_1 on d1 for s1 and s2, act_2 on d1 and d2


def test_the_same_account_twice_is_written_in_order(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=False)
    day = DAYS[0]
    with warehouse.connect() as con:
        first, second = write_spend_many(con, [
            write("act_1", [day], [row("a1", day, "1")]),
            write("act_1", [day], [row("a2", day, "2")]),
        ], synced_at=AT)
        assert (first.rows_written, second.rows_written, second.rows_deleted) == (1, 1, 1)
        assert [ad for _, ad, *_ in spend_rows(con)] == ["a2"]


def test_no_writes_is_a_no_op(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=False)
    with warehouse.connect() as con:
        assert write_spend_many(con, [], synced_at=AT) == []
        assert write_spend_many(con, [write("act_1", [], [])], synced_at=AT) == [
            SpendWriteResult(0, 0, 0, {})
        ]
        with pytest.raises(SpendInputError, match="aware"):
            write_spend_many(con, [], synced_at=datetime(2026, 1, 1))


def test_a_batch_joins_an_outer_transaction(warehouse):
    warehouse = linked_warehouse(warehouse, second_site=False)
    day = DAYS[0]
    with warehouse.connect() as con:
        with pytest.raises(RuntimeError), transaction(con):
            write_spend_many(con, [write("act_1", [day], [row("a1", day, "1")]),
                                   write("act_2", [day], [row("a2", day, "2")])], synced_at=AT)
            raise RuntimeError("the wave failed afterwards")
        assert spend_rows(con) == [] and site_rows(con) == []
