"""Names from many accounts' spend reads, merged at once, equal merging each alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rastro_assets.meta.models import InsightRow, insight_table
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.catalog import upsert_names_from_spend, upsert_names_many
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.warehouse.test_spend import DAYS

AT = datetime(2026, 12, 1, tzinfo=UTC)
ADS_OF = {"act_1": ["1", "2", "3"], "act_2": ["4", "5"]}
names = st.one_of(st.none(), st.sampled_from(["Verão", "Inverno", "春", ""]))
rows_of = {
    account: st.lists(
        st.tuples(st.sampled_from(ads), st.sampled_from(DAYS), names, names, names),
        max_size=6,
        unique_by=lambda row: row[:2],
    )
    for account, ads in ADS_OF.items()
}
waves = st.fixed_dictionaries(rows_of)


def catalog(con) -> list[tuple]:
    return con.execute(
        "SELECT ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name"
        " FROM ad_catalog ORDER BY ad_id"
    ).fetchall()


def linked(path) -> Warehouse:
    warehouse = Warehouse(path)
    with warehouse.connect() as con:
        registry.add_site(con, "s1", None, AT)
        registry.save_connection(con, "c1", b"\0" * 40, AT)
        for account in ADS_OF:
            registry.link_account(con, "s1", account, "c1", "UTC", "USD", AT)
        # An ad another account owns is never taken over by a spend read.
        con.execute(
            "INSERT INTO ad_catalog (ad_id, ad_account_id, ad_name) VALUES ('3', 'act_9', 'x')"
        )
    return warehouse


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=st.lists(waves, min_size=1, max_size=3))
def test_a_batch_merges_names_as_each_account_alone(tmp_path_factory, sequence):
    directory = tmp_path_factory.mktemp("names")
    batched, single = linked(directory / "b.duckdb"), linked(directory / "s.duckdb")
    with batched.connect() as batch_con, single.connect() as single_con:
        for number, wave in enumerate(sequence):
            at = AT + timedelta(hours=number)
            reads = []
            for account, rows in wave.items():
                table = insight_table([
                    InsightRow(ad, day, Decimal("1"), 1, 0, 0, ad_name, None, adset, None, campaign)
                    for ad, day, ad_name, adset, campaign in rows
                ])
                reads.append((account, table))
                upsert_names_from_spend(single_con, account, table, at)
            upsert_names_many(batch_con, reads, at)
            assert catalog(batch_con) == catalog(single_con)
