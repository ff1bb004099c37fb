"""The notebook API: polars frames read from the snapshot only, equal to SQL over it, exact."""

from __future__ import annotations

import os
import shutil
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import polars as pl
import pytest

from rastro_assets.analytics.frames import (
    DIMENSIONS,
    NotTheSnapshot,
    Snapshot,
    SnapshotMissing,
    open_snapshot,
)
from rastro_assets.analytics.publish import Publisher
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse import site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.analytics.helpers import WEEK, published_week
from rastro_assets_tests.analytics.sandbox import (
    KEY_TEXT,
    analyst_folder,
    assert_a_writer_opens_it_now,
    listing,
)
from rastro_fake_graph.world import Figures

METRICS = ["currency", "spend", "impressions", "clicks", "conversations"]


@pytest.fixture
def snapshot_path(request: pytest.FixtureRequest, duckdb_path: Path, tmp_path: Path) -> Path:
    return published_week(request, duckdb_path, tmp_path / "analysts" / "analytics.duckdb")


@pytest.fixture
def snap(snapshot_path: Path, duckdb_path: Path) -> Snapshot:
    return Snapshot(snapshot_path, environ={"RASTRO_DUCKDB_PATH": str(duckdb_path)})


def in_sql(path: Path, query: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(query, params or []).fetchall()


def rows(frame: pl.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(row) for row in frame.select(columns).iter_rows()]


def test_spend_by_account_equals_the_snapshots_sums(snap, snapshot_path):
    frame = snap.spend(*WEEK, by="account")
    expected = in_sql(
        snapshot_path,
        """SELECT s.ad_account_id, m.name, m.currency, sum(s.spend), sum(s.impressions),
                  sum(s.clicks), sum(s.conversations)
           FROM ad_spend_daily s JOIN meta_ad_accounts m USING (ad_account_id)
           WHERE day BETWEEN ? AND ? GROUP BY ALL ORDER BY 1""",
        list(WEEK),
    )
    assert frame.columns == ["ad_account_id", "account_name", *METRICS]
    assert rows(frame, frame.columns) == expected
    assert {row[2] for row in expected} == {"BRL", "JPY"}
    assert frame.schema["spend"] == pl.Decimal(38, 4)
    assert frame.schema["impressions"] == pl.Int64
    assert all(isinstance(value, Decimal) for value in frame["spend"])


def test_money_stays_exact(snap, syncer, warehouse, linked_world, fake_clock, snapshot_path):
    """Figures no binary float holds exactly come back digit for digit."""
    with duckdb.connect(str(snapshot_path), read_only=True) as con:
        ads = [
            row[0]
            for row in con.execute(
                "SELECT DISTINCT ad_id FROM ad_spend_daily WHERE ad_account_id = 'act_101'"
                " ORDER BY 1 LIMIT 3"
            ).fetchall()
        ]
    day = WEEK[1]
    figures = [Decimal("0.1000"), Decimal("0.2000"), Decimal("1234567890.0001")]
    for ad_id, spend in zip(ads, figures, strict=True):
        linked_world.set_ad_day(
            "act_101", ad_id, day, Figures(spend=spend, impressions=1, clicks=0)
        )
    fake_clock.advance(timedelta(minutes=45))
    assert syncer.sync(SyncRequest("act_101", day, day, run_id="r3")).ok
    Publisher(warehouse, snapshot_path, clock=fake_clock, timer=fake_clock).publish()
    frame = snap.spend(day, day, by="ad", ad_account_id="act_101")
    picked = frame.filter(pl.col("ad_id").is_in(ads)).sort("ad_id")
    assert picked["spend"].to_list() == figures
    total = in_sql(
        snapshot_path,
        "SELECT sum(spend) FROM ad_spend_daily WHERE ad_account_id = 'act_101' AND day = ?",
        [day],
    )[0][0]
    assert frame["spend"].sum() == total and Decimal("0.3000") + figures[2] <= total


def test_spend_by_day_splits_currencies(snap, snapshot_path):
    frame = snap.spend(*WEEK)
    expected = in_sql(
        snapshot_path,
        """SELECT day, currency, sum(spend), sum(impressions), sum(clicks), sum(conversations)
           FROM ad_spend_daily JOIN meta_ad_accounts USING (ad_account_id)
           WHERE day BETWEEN ? AND ? GROUP BY ALL ORDER BY 1, 2""",
        list(WEEK),
    )
    assert frame.columns == ["day", *METRICS]
    assert rows(frame, frame.columns) == expected
    assert frame.height == 2 * 7


def test_spend_by_campaign_names_campaigns_and_keeps_uncatalogued_spend(
    snap, snapshot_path, warehouse, fake_clock
):
    # An ad Meta reported spend for but the catalog does not know yet.
    with warehouse.connect() as con:
        [(lost,)] = con.execute(
            "DELETE FROM ad_catalog WHERE ad_id = (SELECT min(ad_id) FROM ad_spend_daily"
            " WHERE ad_account_id = 'act_202') RETURNING ad_id"
        ).fetchall()
    Publisher(warehouse, snapshot_path, clock=fake_clock, timer=fake_clock).publish()
    frame = snap.spend(*WEEK, by="campaign")
    expected = in_sql(
        snapshot_path,
        """SELECT s.ad_account_id, c.campaign_id, c.campaign_name, sum(s.spend)
           FROM ad_spend_daily s LEFT JOIN ad_catalog c USING (ad_id)
           WHERE day BETWEEN ? AND ? GROUP BY ALL ORDER BY 1, 2 NULLS LAST""",
        list(WEEK),
    )
    assert frame.columns == [
        "ad_account_id",
        "account_name",
        "campaign_id",
        "campaign_name",
        *METRICS,
    ]
    assert rows(frame, ["ad_account_id", "campaign_id", "campaign_name", "spend"]) == expected
    assert frame["campaign_name"].null_count() == 1
    # Its spend is one row with no campaign, not lost.
    [unknown] = frame.filter(pl.col("campaign_id").is_null()).iter_rows(named=True)
    assert unknown["ad_account_id"] == "act_202"
    assert (
        unknown["spend"]
        == in_sql(
            snapshot_path,
            "SELECT sum(spend) FROM ad_spend_daily WHERE ad_id = ? AND day BETWEEN ? AND ?",
            [lost, *WEEK],
        )[0][0]
    )
    assert (
        frame["spend"].sum()
        == in_sql(
            snapshot_path,
            "SELECT sum(spend) FROM ad_spend_daily WHERE day BETWEEN ? AND ?",
            list(WEEK),
        )[0][0]
    )


@pytest.mark.parametrize("by", ["adset", "ad"])
def test_spend_by_adset_and_ad(snap, snapshot_path, by):
    key = f"{by}_id"
    frame = snap.spend(*WEEK, by=by, ad_account_id="act_101")
    join = "ad_id" if by == "ad" else "adset_id"
    column = "s.ad_id" if by == "ad" else "c.adset_id"
    expected = in_sql(
        snapshot_path,
        f"""SELECT {column}, sum(s.spend), sum(s.clicks)
            FROM ad_spend_daily s LEFT JOIN ad_catalog c USING (ad_id)
            WHERE s.ad_account_id = 'act_101' AND day BETWEEN ? AND ? GROUP BY 1 ORDER BY 1""",
        list(WEEK),
    )
    assert rows(frame, [key, "spend", "clicks"]) == expected
    assert join in frame.columns and "campaign_name" in frame.columns
    assert frame[f"{by}_name"].null_count() == 0


def test_spend_by_site_equals_site_spend_daily(snap, snapshot_path):
    frame = snap.spend(*WEEK, by="site")
    expected = in_sql(
        snapshot_path,
        """SELECT site_id, sites.name, currency, sum(spend), sum(impressions), sum(clicks),
                  sum(conversations)
           FROM site_spend_daily JOIN sites USING (site_id)
           JOIN meta_ad_accounts USING (ad_account_id)
           WHERE day BETWEEN ? AND ? GROUP BY ALL ORDER BY 1, 3""",
        list(WEEK),
    )
    assert frame.columns == ["site_id", "site_name", *METRICS]
    assert rows(frame, frame.columns) == expected
    assert {row[0] for row in expected} == {"s1", "s2"}


def test_filters_narrow_the_accounts_and_count_a_shared_account_once(snap, snapshot_path):
    only_s2 = snap.spend(*WEEK, by="account", site_id="s2")
    assert only_s2["ad_account_id"].to_list() == ["act_202"]
    both = snap.spend(*WEEK, by="account", site_id=["s1", "s2"])
    assert both["ad_account_id"].to_list() == ["act_101", "act_202"]
    # act_202 belongs to both sites: summed by day it still counts once.
    jpy = snap.spend(*WEEK, site_id=["s1", "s2"], ad_account_id="act_202")
    expected = in_sql(
        snapshot_path,
        "SELECT sum(spend) FROM ad_spend_daily WHERE ad_account_id = 'act_202'"
        " AND day BETWEEN ? AND ?",
        list(WEEK),
    )[0][0]
    assert jpy["spend"].sum() == expected and set(jpy["currency"]) == {"JPY"}
    per_site = snap.spend(*WEEK, by=["site", "account"], ad_account_id="act_202")
    assert per_site["site_id"].to_list() == ["s1", "s2"]
    assert per_site["spend"].to_list() == [expected, expected]


def test_several_dimensions_and_one_day(snap, snapshot_path):
    day = WEEK[1]
    frame = snap.spend(day.isoformat(), day.isoformat(), by=["account", "day"])
    assert frame.columns == ["ad_account_id", "account_name", "day", *METRICS]
    assert frame["day"].to_list() == [day, day]
    assert snap.spend(date(2020, 1, 1), date(2020, 1, 31), by="campaign").height == 0


def test_bad_arguments_say_what_is_wrong(snap):
    with pytest.raises(ValueError, match="knows day, account"):
        snap.spend(*WEEK, by="week")
    with pytest.raises(ValueError, match="after until"):
        snap.spend(WEEK[1], WEEK[0])
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        snap.spend("last week", WEEK[1])
    assert set(DIMENSIONS) == {"day", "account", "campaign", "adset", "ad", "site"}


def test_status_is_account_sync_status(snap, snapshot_path):
    frame = snap.status()
    assert frame["ad_account_id"].to_list() == ["act_101", "act_202"]
    assert frame["sites"].to_list() == [["s1"], ["s1", "s2"]]
    assert frame.columns == [
        row[0] for row in in_sql(snapshot_path, "DESCRIBE account_sync_status")
    ]


def test_sql_takes_parameters(snap, snapshot_path):
    frame = snap.sql(
        "SELECT ad_id, spend FROM ad_spend_daily WHERE ad_account_id = ? AND day = ?"
        " ORDER BY ad_id",
        ["act_101", WEEK[0]],
    )
    assert rows(frame, ["ad_id", "spend"]) == in_sql(
        snapshot_path,
        "SELECT ad_id, spend FROM ad_spend_daily WHERE ad_account_id = 'act_101' AND day = ?"
        " ORDER BY ad_id",
        [WEEK[0]],
    )
    assert snap.sql("SELECT $n AS n", {"n": 3})["n"].to_list() == [3]


def test_the_snapshot_is_read_only(snap):
    with pytest.raises(duckdb.Error, match="read-only"):
        snap.sql("DELETE FROM ad_spend_daily")
    with pytest.raises(duckdb.Error, match="read-only"):
        snap.sql("CREATE TABLE mine AS SELECT 1")
    assert snap.sql("SELECT count(*) AS n FROM ad_spend_daily")["n"][0] > 0


@pytest.fixture
def secrets_file(duckdb_path: Path) -> Path:
    key = duckdb_path.parent / "secrets.key"
    key.write_text("the-key-nobody-reads")
    return key


def test_no_file_nor_url_but_the_snapshot_is_reached(
    snap, snapshot_path, duckdb_path, secrets_file
):
    mine = snapshot_path.parent / "mine.csv"
    mine.write_text("a\n1\n")
    reaching = [
        ("SELECT content FROM read_text(?)", [str(secrets_file)]),
        ("SELECT content FROM read_blob(?)", [str(duckdb_path)]),
        ("SELECT content FROM read_text('/etc/passwd')", None),
        ("SELECT * FROM glob(?)", [f"{snapshot_path.parent}/*"]),
        ("SELECT * FROM read_csv(?)", [str(mine)]),
        ("SELECT * FROM read_parquet('http://127.0.0.1:9/x.parquet')", None),
        ("SELECT * FROM read_json('s3://bucket/x.json')", None),
        ("COPY (SELECT 1) TO '/dev/null' (FORMAT csv)", None),
        ("ATTACH ? AS pipeline (READ_ONLY)", [str(duckdb_path)]),
    ]
    for query, params in reaching:
        with pytest.raises(duckdb.PermissionException):
            snap.sql(query, params)


def test_no_extension_loads_and_the_settings_are_locked(snap):
    with snap.connect() as con:
        for statement in ("INSTALL httpfs", "LOAD httpfs"):
            with pytest.raises(duckdb.PermissionException):
                con.execute(statement)
        for setting in ("enable_external_access = true", "autoload_known_extensions = true"):
            with pytest.raises(duckdb.InvalidInputException, match="locked"):
                con.execute(f"SET {setting}")
        with pytest.raises(duckdb.CatalogException, match="sqlite"):
            con.execute("SELECT * FROM sqlite_scan('x.db', 't')")
        assert con.execute("SELECT count(*) FROM ad_spend_daily").fetchone()[0] > 0


def test_each_call_reads_the_latest_publish_even_with_a_session_open(
    snap, snapshot_path, warehouse, fake_clock, now
):
    before = snap.published_at()
    with duckdb.connect(str(snapshot_path), read_only=True) as session:  # the notebook's own
        with snap.connect() as held:
            fake_clock.advance(timedelta(minutes=10))
            with warehouse.connect() as con:
                site_store.add_site(con, "s3", "Site three", now)
            Publisher(warehouse, snapshot_path, clock=fake_clock, timer=fake_clock).publish()
            # An open connection keeps the publish it opened...
            assert held.execute("SELECT count(*) FROM sites").fetchone()[0] == 2
            assert session.execute("SELECT count(*) FROM sites").fetchone()[0] == 2
        # ...and the next call reads the new one, though the notebook's session is open.
        assert snap.published_at() > before
        assert snap.sql("SELECT site_id FROM sites ORDER BY 1")["site_id"].to_list() == [
            "s1",
            "s2",
            "s3",
        ]


def test_a_missing_snapshot_is_never_created(tmp_path: Path):
    path = tmp_path / "data" / "analytics.duckdb"
    pipeline = {"RASTRO_DUCKDB_PATH": str(path.with_name("rastro.duckdb"))}
    snap = Snapshot(path, environ=pipeline)
    # No pipeline there either: the truth is "no file here", not "wait for a publish".
    with pytest.raises(SnapshotMissing, match="no analytics snapshot at .*: no such file"):
        snap.status()
    assert not path.exists() and not path.parent.exists()
    Warehouse(pipeline["RASTRO_DUCKDB_PATH"]).migrate()
    with pytest.raises(SnapshotMissing, match="no analytics snapshot has been published yet"):
        snap.status()
    with pytest.raises(SnapshotMissing, match="rastro publish"):
        snap.spend(*WEEK)
    assert not path.exists()


def test_the_path_comes_from_the_environment(tmp_path: Path, snapshot_path: Path):
    pipeline = tmp_path / "elsewhere" / "rastro.duckdb"
    assert Snapshot(environ={"RASTRO_DUCKDB_PATH": str(pipeline)}).path == (
        pipeline.parent / "analytics.duckdb"
    )
    chosen = Snapshot(environ={"RASTRO_ANALYTICS_PATH": str(snapshot_path)})
    assert chosen.path == snapshot_path and chosen.status().height == 2
    # Run from the checkout (as the tests are): its own data/.
    repo = Path(__file__).resolve().parents[2]
    assert Snapshot(environ={}).path == repo / "data" / "analytics.duckdb"


def test_the_pipelines_file_is_refused(warehouse, duckdb_path: Path):
    snap = Snapshot(duckdb_path, environ={"RASTRO_DUCKDB_PATH": str(duckdb_path)})
    with pytest.raises(NotTheSnapshot, match="pipeline's own file"):
        snap.status()
    relative = Path(os.path.relpath(duckdb_path))
    with pytest.raises(NotTheSnapshot), open_snapshot(relative, pipeline_path=duckdb_path):
        pass


# An analyst's folder decides nothing the sandbox may reach ----------------------------------


@pytest.fixture
def key_file(duckdb_path: Path) -> Path:
    key = duckdb_path.parent / "secrets.key"
    key.write_text(KEY_TEXT)
    return key


def spill_targets(key_file: Path) -> dict[str, Path]:
    return {"root": Path("/"), "the key's folder": key_file.parent}


@pytest.mark.parametrize("target", ["root", "the key's folder"])
def test_a_tmp_symlink_in_the_working_directory_opens_nothing(
    snapshot_path, duckdb_path, key_file, tmp_path, monkeypatch, target
):
    folder = analyst_folder(tmp_path, spill_targets(key_file)[target])
    monkeypatch.chdir(folder)
    snap = Snapshot(snapshot_path, environ={"RASTRO_DUCKDB_PATH": str(duckdb_path)})
    before = listing(key_file.parent)
    reaching = [
        "SELECT content FROM read_text('/proc/self/environ')",
        f"SELECT content FROM read_text('{key_file}')",
        f"SELECT content FROM read_blob('{duckdb_path}')",
        f"SELECT * FROM glob('{key_file.parent}/*')",
        f"SELECT * FROM read_csv('{key_file}', header = false)",
        f"ATTACH '{duckdb_path}' AS pipeline (READ_ONLY)",
        f"COPY (SELECT 1) TO '{key_file.parent}/dropped.csv'",
        "SELECT content FROM read_text('.tmp/etc/passwd')",
    ]
    for query in reaching:
        with pytest.raises(duckdb.PermissionException) as refused:
            snap.sql(query)
        assert KEY_TEXT not in str(refused.value)
    assert snap.status().height == 2 and snap.spend(*WEEK).height > 0
    with snap.connect() as con:
        assert con.execute(
            "SELECT current_setting('allowed_directories'), current_setting('temp_directory')"
        ).fetchone() == ([], "")
        for setting in ("temp_directory = '/'", "allowed_directories = ['/']"):
            with pytest.raises(duckdb.InvalidInputException, match="locked"):
                con.execute(f"SET {setting}")
    assert listing(key_file.parent) == before


def test_attach_of_the_pipelines_file_is_refused_whatever_the_folder(
    snap, duckdb_path, tmp_path, monkeypatch
):
    monkeypatch.chdir(analyst_folder(tmp_path, Path("/")))
    with snap.connect() as con:
        with pytest.raises(duckdb.PermissionException):
            con.execute("ATTACH ? AS pipeline (READ_ONLY)", [str(duckdb_path)])
        with pytest.raises(duckdb.CatalogException):
            con.execute("SELECT * FROM pipeline.meta_connections")
        attached = con.execute("SELECT database_name FROM duckdb_databases()").fetchall()
        assert "pipeline" not in {name for (name,) in attached}


def test_no_function_reads_the_environment(snap, secrets_key):
    with pytest.raises(duckdb.CatalogException):
        snap.sql("SELECT getenv('RASTRO_SECRETS_KEY')")
    settings = snap.sql("SELECT name, value FROM duckdb_settings()")
    assert not any(secrets_key in str(value) for value in settings["value"])


def test_a_file_with_the_pipelines_tables_is_refused_at_any_path(
    snap, warehouse, duckdb_path, tmp_path, syncer
):
    """A copy, and a link under another name while RASTRO_DUCKDB_PATH names another file:
    both hold `meta_connections`, so neither is a snapshot."""
    copy = tmp_path / "analysts" / "copy.duckdb"
    shutil.copyfile(duckdb_path, copy)
    link = tmp_path / "analysts" / "looks-like-a-snapshot.duckdb"
    link.symlink_to(duckdb_path)
    elsewhere = {"RASTRO_DUCKDB_PATH": str(tmp_path / "elsewhere" / "rastro.duckdb")}
    for path in (copy, link, Path(os.path.relpath(link))):
        with pytest.raises(NotTheSnapshot) as refused:
            Snapshot(path, environ=elsewhere).status()
        message = str(refused.value)
        assert message.startswith(f"{os.path.abspath(path)} holds the pipeline's own tables")
        assert "meta_connections" in message and "\n" not in message
        with pytest.raises(NotTheSnapshot), open_snapshot(path):
            pass
        # The refusal let go of the file at once: the pipeline's writers are not held up.
        assert_a_writer_opens_it_now(duckdb_path)
