"""Publishing the analytics snapshot against copying its file.

The pipeline's warehouse holds 1,000 linked accounts (eight timezones, each with its currency;
one in five linked to two sites) with 365 days of history, built by set-based SQL and Arrow
(not through Meta):

- `ad_catalog`: 50-100 ads an account, with names; `ad_thumbnails`: one image for each, random
  bytes of 4-20 KB (JPEG-sized, incompressible: most of the file's bytes);
- `ad_spend_daily`: on average ~20 ads delivering an account-day (5-35 depending on the
  account; an ad delivers in week-long stretches), spend DECIMAL(18, 4) in cents, counts;
- `site_spend_daily`: the exact sums for each linked site;
- `meta_sync_runs`: what the cadence leaves with retention (35 days): the 90-day backfill at
  linking (three 30-day runs), a daily re-sync at 04:00 local every day since (28 days every
  seventh day), a live read every 45 minutes for the last 35 days (~1% failed).

Measured:
(a) the first publish (a new staging file, every table copied): informational;
(b) steady state: a live wave rewrites, for every account, its local today and yesterday
    (~40% of the ad-days get new figures, 2% are deleted, a few are added, the site sums
    follow) and adds the wave's `meta_sync_runs` rows (started, then finished); then one
    publish. Repeated for several waves (45 minutes apart), median;
(c) `cp` of the published snapshot (subprocess, beside it) in every wave, before the publish
    in even waves and after it in odd ones, medians: bare; followed by an fsync of the copy
    (a publish flushes its copy before renaming it: a rename over a file that is not on disk
    yet could leave an empty snapshot after a power cut); and cp to a temporary name, fsync,
    rename over a previous copy and fsync of the directory, which is what an atomic replace
    costs on this filesystem (renaming over a 1 GB file frees its blocks: ext4 here is mounted
    with `discard`). The figure is publish / (cp + fsync); the others are printed beside it.
(d) The pipeline's write path: publishing adds no statement to a write (`write_spend` and the
    run rows are unchanged; runs call `publish_if_due` at their end, once their writes are
    committed and their connections closed). What a publish costs the writers is the time it
    holds the pipeline's file: the staging refresh (`refresh_seconds`) and the statement that
    records the publish; the copy reads only the staging file. That hold is printed.

(e) The same warehouse on PostgreSQL (a server started here, every table copied over ADBC's
    COPY, each wave's rows copied after it): the first publish and each wave's publish from it
    (the staging file refreshed over ADBC), side by side with DuckDB's (goal <= 30 s for the
    first, <= 2 s for a wave). `--engines duckdb` leaves it out.

`--breakdown` times the statements of one more refresh and the copy's parts.
At the end the snapshot is compared with the pipeline: per table the row count, the spend
totals and a sum of per-row hashes over every copied column (the images' bytes included).

Run: .venv/bin/python bench/publish.py [--accounts 1000] [--days 365] [--waves 5] [--breakdown]
                                       [--keep FILE] [--engines duckdb,postgres]
(~3 min at the defaults, 1.5 min with --keep; `--accounts 50 --days 30` for a quick run)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

NOW = _world.NOW
TIMEZONES = [
    ("America/Los_Angeles", "USD"), ("America/New_York", "USD"), ("America/Sao_Paulo", "BRL"),
    ("Europe/London", "GBP"), ("Europe/Berlin", "EUR"), ("Asia/Kolkata", "INR"),
    ("Asia/Tokyo", "JPY"), ("Pacific/Auckland", "NZD"),
]
THEMES = [
    "Black Friday", "Remarketing 30d", "Lookalike 1%", "Brand awareness", "Catalog sales",
    "Lead form", "Video views", "Messages WhatsApp", "Promo Natal", "Frete gratis",
]
LIVE_PER_DAY = 32  # every 45 minutes
RETENTION_DAYS = 35  # RASTRO_SYNC_RUN_RETENTION_DAYS
THUMB_BYTES = (4096, 20480)
GOAL = 1.5


# -- the pipeline's warehouse ---------------------------------------------------------------


def build(path: Path, accounts: int, days: int) -> dict[str, int]:
    """The pipeline's warehouse; row counts of what was built."""
    from rastro_assets.warehouse.connection import Warehouse, register_arrow

    backfill_days = min(90, days)
    linked_at = NOW - timedelta(days=days - backfill_days, hours=3)
    warehouse = Warehouse(path)
    warehouse.migrate()
    params = {"now": NOW, "linked": linked_at, "n": accounts}
    with warehouse.connect() as con:
        con.execute(
            "INSERT INTO meta_connections (connection_id, status, sealed_token, sealed_at,"
            " created_at, updated_at) VALUES ('c1', 'active', ?, ?, ?, ?)",
            [os.urandom(120), linked_at, linked_at, linked_at],
        )
        sites = max(1, accounts * 7 // 10)
        con.execute(
            "INSERT INTO sites SELECT 's' || i, 'Loja ' || i, $linked FROM range($sites) t(i)",
            {"linked": linked_at, "sites": sites},
        )
        con.execute(
            """
            CREATE TABLE bench_accounts AS
            SELECT i, 'act_' || (200000 + i) AS act, $tz[i % 8 + 1] AS tz,
                   $cur[i % 8 + 1] AS currency,
                   50 + (hash(i, 'catalog') % 51)::INTEGER AS n_ads,
                   5 + (hash(i, 'delivering') % 31)::INTEGER AS k,
                   timezone($tz[i % 8 + 1], $linked::TIMESTAMPTZ)::DATE AS link_day,
                   timezone($tz[i % 8 + 1], $now::TIMESTAMPTZ)::DATE AS today, $days AS days
            FROM range($n) t(i)
            """,
            {**params, "days": days, "tz": [tz for tz, _ in TIMEZONES],
             "cur": [currency for _, currency in TIMEZONES]},
        )
        con.execute(
            """
            INSERT INTO meta_ad_accounts
                (ad_account_id, connection_id, timezone, currency, name, created_at)
            SELECT act, 'c1', tz, currency, 'Conta ' || i, $linked FROM bench_accounts
            """,
            {"linked": linked_at},
        )
        con.execute(
            """
            INSERT INTO site_ad_accounts
            SELECT 's' || (i % $sites), act, $linked FROM bench_accounts
            UNION ALL
            SELECT 's' || ((i + $sites // 2 + 1) % $sites), act, $linked FROM bench_accounts
            WHERE i % 5 = 0 AND (i + $sites // 2 + 1) % $sites <> i % $sites
            """,
            {"linked": linked_at, "sites": sites},
        )
        con.execute(
            """
            INSERT INTO ad_catalog
            SELECT '1202' || lpad((i * 1000 + a)::VARCHAR, 9, '0') AS ad_id, act,
                   $themes[(hash(i, a // 12) % 10)::INTEGER + 1] || ' | criativo ' || a
                       || CASE a % 3 WHEN 0 THEN ' (video 15s)' WHEN 1 THEN ' (imagem)'
                          ELSE ' (carrossel)' END,
                   '1203' || lpad((i * 1000 + a // 4)::VARCHAR, 9, '0'),
                   'Conjunto ' || a // 4 || ' - ' || ['Brasil 25-44', 'Lookalike', 'Interesses',
                       'Publico amplo'][a // 4 % 4 + 1],
                   '1204' || lpad((i * 1000 + a // 12)::VARCHAR, 9, '0'),
                   $themes[(hash(i, a // 12) % 10)::INTEGER + 1] || ' ' || (2025 + a // 50),
                   CASE WHEN hash(i, a, 'status') % 10 < 7 THEN 'ACTIVE' ELSE 'PAUSED' END,
                   ['VIDEO', 'IMAGE', 'CAROUSEL'][a % 3 + 1],
                   '1205' || lpad((i * 1000 + a)::VARCHAR, 9, '0'),
                   'https://scontent.xx.fbcdn.net/v/t45.1600-4/' || hash(i, a) || '_n.jpg',
                   $linked + to_days((hash(i, a, 'updated') % 200)::INTEGER)
            FROM bench_accounts, range(100) t(a)
            WHERE a < n_ads
            ORDER BY act, a
            """,
            {"linked": linked_at, "themes": THEMES},
        )
        # Spend: the backfill's 90 days written account by account, the rest day by day.
        con.execute(
            """
            INSERT INTO ad_spend_daily
            SELECT act, '1202' || lpad((i * 1000 + a)::VARCHAR, 9, '0'), day,
                   (cents / 100.0)::DECIMAL(18, 4), impressions,
                   impressions * (hash(i, a, d, 'c') % 40) // 1000,
                   CASE WHEN hash(i, a, d, 'm') % 10 < 3 THEN hash(i, a, d, 'n') % 6 ELSE 0 END,
                   least($now, timezone(tz, day + 7 + TIME '04:02:00'))
            FROM (
                SELECT i, act, tz, link_day, a, d, today - d::INTEGER AS day,
                       1 + hash(i, a, d, 's') % 30000 AS cents,
                       (1 + hash(i, a, d, 's') % 30000) * (5 + hash(i, a, d, 'i') % 40) // 10
                           AS impressions
                FROM bench_accounts, range($days) r(d), range(100) t(a)
                WHERE a < n_ads AND hash(i, a, (d + i) // 7) % n_ads < k
            )
            ORDER BY day > link_day, CASE WHEN day <= link_day THEN act END, day, act
            """,
            {"now": NOW, "days": days},
        )
        con.execute(
            """
            INSERT INTO site_spend_daily
            SELECT l.site_id, s.ad_account_id, s.day, sum(s.spend), sum(s.impressions),
                   sum(s.clicks), sum(s.conversations), count(*)
            FROM ad_spend_daily s JOIN site_ad_accounts l USING (ad_account_id)
            GROUP BY ALL ORDER BY s.day, l.site_id, s.ad_account_id
            """
        )
        _build_runs(con, linked_at, backfill_days)
        catalog = con.execute(
            "SELECT ad_id, creative_id, updated_at FROM ad_catalog ORDER BY ad_account_id, ad_id"
        ).fetchall()
    import pyarrow as pa

    rng = random.Random(13)
    for start in range(0, len(catalog), 4000):
        batch = catalog[start:start + 4000]
        images = [os.urandom(rng.randint(*THUMB_BYTES)) for _ in batch]
        table = pa.table({
            "ad_id": [row[0] for row in batch],
            "content_type": ["image/jpeg"] * len(batch),
            "image": pa.array(images, pa.binary()),
            "sha256": [hashlib.sha256(image).hexdigest() for image in images],
            "creative_id": [row[1] for row in batch],
            "fetched_at": pa.array([row[2] for row in batch], pa.timestamp("us", tz="UTC")),
        })
        with warehouse.connect() as con:
            register_arrow(con, "thumbs", table)
            con.execute("INSERT INTO ad_thumbnails SELECT * FROM thumbs")
            con.unregister("thumbs")
    with warehouse.connect() as con:
        con.execute("CHECKPOINT")
    return counts(warehouse)


def counts(warehouse) -> dict[str, int]:
    with warehouse.connect() as con:
        return {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("ad_spend_daily", "site_spend_daily", "ad_catalog", "ad_thumbnails",
                          "meta_sync_runs", "site_ad_accounts")
        }


def _build_runs(con, linked_at, backfill_days: int) -> None:
    """The rows a steady cadence leaves once retention has pruned older live reads, in start
    order (as syncs append them)."""
    blocks = -(-backfill_days // 30)
    resyncs = _world.resync_runs_sql(
        "SELECT act, tz, d, link_day + 1 + d::INTEGER AS day"
        " FROM bench_accounts, range(($now::DATE - $linked::DATE) + 1) t(d)",
        "started_at > $linked AND started_at < $now",
    )
    con.execute(
        f"""
        INSERT INTO meta_sync_runs
        SELECT * FROM (
            SELECT 'bf-' || b, act, 'backfill',
                   link_day - ($bf - 1) + (30 * b)::INTEGER,
                   least(link_day - ($bf - 1) + (30 * b + 29)::INTEGER, link_day),
                   $linked + to_seconds(60 * b), $linked + to_seconds(60 * b + 50), 'ok',
                   60000, 0, 120, NULL, b = 0, 3.0, NULL, NULL, $linked
            FROM bench_accounts, range($blocks) t(b)
            UNION ALL
            {resyncs}
            UNION ALL
            SELECT 'live-' || k, act, 'live', local_day - 1, local_day, started_at,
                   started_at + INTERVAL 40 SECOND, outcome, 400, 0, 2,
                   CASE WHEN outcome <> 'ok' THEN 'META_UNAVAILABLE: the connection failed' END,
                   false, (hash(act, k) % 50)::DOUBLE, NULL, NULL, $linked
            FROM (
                SELECT act, k, started_at, timezone(tz, started_at)::DATE AS local_day,
                       CASE WHEN hash(act, k, 'o') % 100 = 0 THEN 'other' ELSE 'ok' END
                           AS outcome
                FROM (SELECT act, tz, t.k,
                             greatest($linked, $now - INTERVAL ($keep) DAY)
                                 + to_minutes(45 * t.k + (hash(i) % 45)::INTEGER) AS started_at
                      FROM bench_accounts, range($live) t(k))
                WHERE started_at < $now - INTERVAL 10 MINUTE
            )
        ) ORDER BY 6
        """,
        {"linked": linked_at, "now": NOW, "bf": backfill_days, "blocks": blocks,
         "keep": RETENTION_DAYS, "live": RETENTION_DAYS * LIVE_PER_DAY + 1},
    )


def live_wave(warehouse, wave: int, at) -> dict[str, int]:
    """Every account's live read of its local yesterday and today, as the writer leaves it."""
    p = {"at": at, "wave": wave}
    with warehouse.connect() as con:
        con.execute("BEGIN TRANSACTION")
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE wave_days AS
            SELECT i, act, tz, timezone(tz, $at::TIMESTAMPTZ)::DATE AS today FROM bench_accounts
            """,
            {"at": at},
        )
        con.execute(
            """
            INSERT INTO meta_sync_runs (run_id, ad_account_id, kind, since, until, started_at,
                                        catalog, token_sealed_at)
            SELECT 'wave-' || $wave, act, 'live', today - 1, today,
                   $at::TIMESTAMPTZ - to_seconds((hash(i, $wave) % 60)::INTEGER), false,
                   (SELECT sealed_at FROM meta_connections LIMIT 1)
            FROM wave_days ORDER BY act
            """,
            p,
        )
        con.execute("COMMIT")
        con.execute("BEGIN TRANSACTION")
        deleted = con.execute(
            """
            DELETE FROM ad_spend_daily s USING wave_days w
            WHERE s.ad_account_id = w.act AND s.day BETWEEN w.today - 1 AND w.today
              AND hash(s.ad_id, s.day, $wave, 'gone') % 100 < 2
            RETURNING 1
            """,
            {"wave": wave},
        ).fetchall()
        changed = con.execute(
            """
            UPDATE ad_spend_daily s
            SET spend = s.spend + ((1 + hash(s.ad_id, s.day, $wave) % 2000) / 100.0)::DECIMAL(18,4),
                impressions = s.impressions + hash(s.ad_id, s.day, $wave, 'i') % 900,
                clicks = s.clicks + hash(s.ad_id, s.day, $wave, 'c') % 9,
                synced_at = $at
            FROM wave_days w
            WHERE s.ad_account_id = w.act AND s.day BETWEEN w.today - 1 AND w.today
              AND hash(s.ad_id, s.day, $wave, 'u') % 100 < 40
            RETURNING 1
            """,
            p,
        ).fetchall()
        added = con.execute(
            """
            INSERT OR IGNORE INTO ad_spend_daily
            SELECT c.ad_account_id, c.ad_id, w.today - b.back,
                   ((1 + hash(c.ad_id, $wave, 's') % 9000) / 100.0)::DECIMAL(18, 4),
                   hash(c.ad_id, $wave, 'i') % 3000, hash(c.ad_id, $wave, 'c') % 30, 0, $at
            FROM ad_catalog c JOIN wave_days w ON c.ad_account_id = w.act,
                 (SELECT unnest([0, 1]) AS back) b
            WHERE hash(c.ad_id, w.today - b.back, $wave, 'new') % 100 < 2
            RETURNING 1
            """,
            p,
        ).fetchall()
        con.execute(
            """
            DELETE FROM site_spend_daily t USING wave_days w
            WHERE t.ad_account_id = w.act AND t.day BETWEEN w.today - 1 AND w.today
            """
        )
        con.execute(
            """
            INSERT INTO site_spend_daily
            SELECT l.site_id, s.ad_account_id, s.day, sum(s.spend), sum(s.impressions),
                   sum(s.clicks), sum(s.conversations), count(*)
            FROM ad_spend_daily s JOIN wave_days w ON s.ad_account_id = w.act
                 JOIN site_ad_accounts l ON l.ad_account_id = s.ad_account_id
            WHERE s.day BETWEEN w.today - 1 AND w.today
            GROUP BY ALL
            """
        )
        con.execute("COMMIT")
        con.execute(
            """
            UPDATE meta_sync_runs
            SET finished_at = $at::TIMESTAMPTZ + INTERVAL 30 SECOND,
                outcome = CASE WHEN hash(ad_account_id, $wave, 'o') % 100 = 0 THEN 'other'
                               ELSE 'ok' END,
                rows_written = 40, rows_deleted = 1, api_calls = 2, usage_pct = 4.0
            WHERE run_id = 'wave-' || $wave
            """,
            p,
        )
    return {"changed": len(changed), "deleted": len(deleted), "added": len(added)}


# -- the same warehouse on PostgreSQL ---------------------------------------------------------


BENCH_ONLY = {"bench_accounts", "schema_version"}


def postgres_twin(warehouse, server):
    """A PostgreSQL warehouse holding every table of `warehouse`, copied over ADBC (binary
    COPY, the columns in the same order: the same migrations made both)."""
    import adbc_driver_postgresql.dbapi as adbc

    from rastro_assets.warehouse.postgres import PostgresWarehouse

    url = (f"postgresql://{server.user}:{server.password}@{server.host}:{server.port}/"
           f"{server.db}?sslmode=require")
    twin = PostgresWarehouse(url)
    twin.migrate()
    with warehouse.connect(read_only=True) as duck, adbc.connect(url) as pg:
        tables = [name for (name,) in duck.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'"
            " AND database_name = current_database()").fetchall() if name not in BENCH_ONLY]
        cursor = pg.cursor()
        for table in tables:
            cursor.adbc_ingest(table, duck.sql(f"SELECT * FROM {table}").to_arrow_reader(),
                               mode="append")
        pg.commit()
        cursor.execute("ANALYZE")
        pg.commit()
    return twin


def copy_wave(warehouse, twin, wave: int, at) -> None:
    """The wave's writes, copied to the twin in one transaction: the spend of every day it
    may have touched, and its run rows."""
    import adbc_driver_postgresql.dbapi as adbc

    with warehouse.connect(read_only=True) as duck, adbc.connect(twin.url_with_password) as pg:
        low = duck.execute(
            "SELECT min(timezone(tz, $at::TIMESTAMPTZ)::DATE) - 1 FROM bench_accounts", {"at": at}
        ).fetchall()[0][0]
        cursor = pg.cursor()
        for table in ("ad_spend_daily", "site_spend_daily"):
            cursor.execute(f"DELETE FROM {table} WHERE day >= $1", [low])
            rows = duck.sql(f"SELECT * FROM {table} WHERE day >= ?", params=[low]).to_arrow_table()
            cursor.adbc_ingest(table, rows, mode="append")
        run_id = f"wave-{wave}"
        cursor.execute("DELETE FROM meta_sync_runs WHERE run_id = $1", [run_id])
        runs = duck.sql("SELECT * FROM meta_sync_runs WHERE run_id = ?", params=[run_id])
        cursor.adbc_ingest("meta_sync_runs", runs.to_arrow_table(), mode="append")
        pg.commit()


# -- measuring --------------------------------------------------------------------------------


COPIES = ("cp", "cp + fsync", "cp + fsync + rename")


def cp(source: Path, directory: Path, how: str) -> float:
    """Seconds to `cp` the snapshot into `directory`: bare; then fsync the copy; or, as an
    atomic publish must, cp to a temporary name, fsync, rename over the previous copy (which
    frees its blocks) and fsync the directory."""
    destination = directory / ("cp-new.tmp" if how == COPIES[2] else "cp-copy.duckdb")
    started = time.perf_counter()
    subprocess.run(["cp", str(source), str(destination)], check=True)
    if how != COPIES[0]:
        with open(destination, "rb") as handle:
            os.fsync(handle.fileno())
    if how == COPIES[2]:
        os.replace(destination, directory / "cp-previous.duckdb")
        descriptor = os.open(directory, os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)
    seconds = time.perf_counter() - started
    if how != COPIES[2]:
        destination.unlink()
    return seconds


class _Timed:
    """A connection that logs how long each statement took."""

    def __init__(self, con, log: list) -> None:
        self._con, self._log = con, log

    def execute(self, query, *args, **kwargs):
        started = time.perf_counter()
        result = self._con.execute(query, *args, **kwargs)
        self._log.append((" ".join(str(query).split()), time.perf_counter() - started))
        return result

    def __getattr__(self, name):
        return getattr(self._con, name)


@contextlib.contextmanager
def instrumented(log: list, parts: dict):
    """Time the statements of `staging.refresh`, the status table and the copy's parts."""
    from rastro_assets.analytics import publish, staging

    originals = (staging.refresh, publish.planned_accounts, publish.status_table,
                 shutil.copyfile)

    def timed(name, fn):
        return _world.timed_into(parts, name, fn)

    staging.refresh = timed("staging.refresh", lambda con, *a: originals[0](_Timed(con, log),
                                                                              *a))
    publish.planned_accounts = timed("planned_accounts", originals[1])
    publish.status_table = timed("status_table", originals[2])
    shutil.copyfile = timed("shutil.copyfile", originals[3])
    try:
        yield
    finally:
        (staging.refresh, publish.planned_accounts, publish.status_table,
         shutil.copyfile) = originals


def verify(warehouse, target: Path) -> list[str]:
    """Tables where the snapshot and the pipeline differ (count, spend, row hashes)."""
    checks = {
        "sites": "site_id, name, created_at",
        "site_ad_accounts": "site_id, ad_account_id, linked_at",
        "meta_ad_accounts": "ad_account_id, connection_id, timezone, currency, name, created_at",
        "ad_spend_daily": "ad_account_id, ad_id, day, spend, impressions, clicks, conversations,"
                          " synced_at",
        "site_spend_daily": "site_id, ad_account_id, day, spend, impressions, clicks,"
                            " conversations",
        "ad_catalog": "ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id,"
                      " campaign_name, ad_status, creative_type, creative_id, updated_at",
        "ad_thumbnails": "ad_id, content_type, image, sha256, fetched_at",
    }
    differ = []
    with warehouse.connect() as con:
        con.execute("ATTACH ? AS snap (READ_ONLY)", [str(target)])
        try:
            for table, columns in checks.items():
                spend = ", sum(spend)" if "spend" in columns else ""
                sql = f"SELECT count(*){spend}, sum(hash({columns})::HUGEINT) FROM "
                ours = con.execute(sql + f"snap.{table}").fetchone()
                theirs = con.execute(sql + f"main.{table}").fetchone()
                print(f"  {table}: {theirs[0]:,} rows"
                      + (f", spend {theirs[1]:,.2f}" if spend else "")
                      + (" (equal)" if ours == theirs else f" DIFFERS: snapshot {ours}"))
                if ours != theirs:
                    differ.append(table)
            accounts = con.execute("SELECT count(*) FROM meta_ad_accounts").fetchone()[0]
            status = con.execute("SELECT count(*) FROM snap.account_sync_status").fetchone()[0]
            print(f"  account_sync_status: {status:,} rows for {accounts:,} accounts")
            if status != accounts:
                differ.append("account_sync_status")
        finally:
            con.execute("DETACH snap")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--waves", type=int, default=5)
    parser.add_argument("--breakdown", action="store_true",
                        help="time the statements of one more refresh")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="build the pipeline's file once into FILE, then start from a copy"
                             " of it (the --accounts and --days it was built with)")
    parser.add_argument("--engines", default="duckdb,postgres",
                        help="duckdb, or duckdb,postgres to publish from both side by side")
    args = parser.parse_args()
    on_postgres = "postgres" in args.engines.split(",")

    from rastro_assets.analytics.publish import Publisher
    from rastro_assets.timekeeping import fixed_clock
    from rastro_assets.warehouse.connection import Warehouse

    with contextlib.ExitStack() as stack:
        pg_server = None
        if on_postgres:
            from rastro_assets_tests.postgres_server import postgres_server

            pg_server = stack.enter_context(postgres_server("warehouse"))
        run(args, pg_server, Publisher, fixed_clock, Warehouse)


def run(args, pg_server, Publisher, fixed_clock, Warehouse) -> None:  # noqa: N803
    mb = 2**20
    with _world.tempdir() as directory:
        root = Path(directory)
        path = root / "data" / "rastro.duckdb"
        target = root / "data" / "analytics.duckdb"
        started = time.perf_counter()
        if args.keep and args.keep.exists():
            path.parent.mkdir()
            shutil.copyfile(args.keep, path)
            how = f"copied from {args.keep}"
        else:
            build(path, args.accounts, args.days)
            how = "built"
            if args.keep:
                shutil.copyfile(path, args.keep)
        warehouse = Warehouse(path)
        built = counts(warehouse)
        with warehouse.connect() as con:
            image_mb = con.execute(
                "SELECT sum(octet_length(image)) FROM ad_thumbnails").fetchone()[0] / mb
            accounts, days = con.execute(
                "SELECT count(*), max(days) FROM bench_accounts").fetchone()
        thumbs = built.pop("ad_thumbnails")
        print(f"{how} in {time.perf_counter() - started:.0f} s: {accounts:,} accounts x "
              f"{days} days, {built.pop('site_ad_accounts'):,} site links; "
              + ", ".join(f"{table} {count:,}" for table, count in built.items())
              + f", ad_thumbnails {thumbs:,}")
        per_day = built["ad_spend_daily"] / (accounts * days)
        print(f"pipeline file {path.stat().st_size / mb:,.0f} MB; thumbnails {image_mb:,.0f} MB "
              f"(random bytes, {THUMB_BYTES[0] // 1024}-{THUMB_BYTES[1] // 1024} KB, "
              f"{image_mb * 1024 / max(thumbs, 1):.1f} KB on average); "
              f"{per_day:.1f} ads delivering an account-day")

        clock_at = NOW + timedelta(minutes=1)
        publisher = Publisher(warehouse, target, clock=fixed_clock(clock_at))
        first = publisher.publish()
        print(f"(a) first publish: {first.duration_seconds:.1f} s (refresh "
              f"{first.refresh_seconds:.1f} s, copy {first.copy_seconds:.1f} s), "
              f"{first.bytes / mb:,.0f} MB, staging rebuilt whole: {len(first.rebuilt)} tables")

        twin = pg = None
        if pg_server is not None:
            from rastro_assets_tests.analytics.mirror import planner_on

            started = time.perf_counter()
            twin = postgres_twin(warehouse, pg_server)
            print(f"(e) copied to PostgreSQL in {time.perf_counter() - started:.0f} s")
            pg_target = root / "pg" / "analytics.duckdb"
            pg_publisher = Publisher(twin, pg_target, clock=fixed_clock(clock_at))
            with planner_on(warehouse):
                pg_first = pg_publisher.publish()
            pg = {"first": pg_first, "walls": [], "results": []}
            print(f"(e) first publish from PostgreSQL: {pg_first.duration_seconds:.1f} s (refresh "
                  f"{pg_first.refresh_seconds:.1f} s, copy {pg_first.copy_seconds:.1f} s), "
                  f"{pg_first.bytes / mb:,.0f} MB; from DuckDB {first.duration_seconds:.1f} s")

        publishes, walls = [], []
        copies: dict[str, list[float]] = {how: [] for how in COPIES}
        copies_dir = root / "copies"
        copies_dir.mkdir()
        shutil.copyfile(target, copies_dir / "cp-previous.duckdb")
        for wave in range(args.waves + args.breakdown):
            at = NOW + timedelta(minutes=45 * (wave + 1))
            wave_started = time.perf_counter()
            rows = live_wave(warehouse, wave, at)
            wave_seconds = time.perf_counter() - wave_started
            publisher = Publisher(warehouse, target, clock=fixed_clock(at + timedelta(minutes=2)))
            if wave == args.waves:  # the --breakdown round, not in the medians
                log, parts = [], {}
                with instrumented(log, parts):
                    result = publisher.publish()
                print_breakdown(result, log, parts)
                break
            # The copies are timed before the publish in even waves, after it in odd ones:
            # neither order gets the disk's or the page cache's favours.
            if wave % 2 == 0:
                for how in COPIES:
                    copies[how].append(cp(target, copies_dir, how))
            started = time.perf_counter()
            result = publisher.publish()
            walls.append(time.perf_counter() - started)
            publishes.append(result)
            if wave % 2 == 1:
                for how in COPIES:
                    copies[how].append(cp(target, copies_dir, how))
            if twin is not None:
                copy_wave(warehouse, twin, wave, at)
                pg_publisher = Publisher(twin, pg_target,
                                         clock=fixed_clock(at + timedelta(minutes=2)))
                pg_started = time.perf_counter()
                with planner_on(warehouse):
                    pg_result = pg_publisher.publish()
                pg["walls"].append(time.perf_counter() - pg_started)
                pg["results"].append(pg_result)
                print(f"(e) wave {wave + 1} from PostgreSQL: publish {pg['walls'][-1]:.2f} s:"
                      f" refresh {pg_result.refresh_seconds:.2f} + copy"
                      f" {pg_result.copy_seconds:.2f} ({pg_result.changed_account_days:,}"
                      " account-days"
                      f"{', healed ' + ', '.join(pg_result.healed) if pg_result.healed else ''})")
            recording = walls[-1] - result.duration_seconds
            print(f"(b) wave {wave + 1}: wrote {rows['changed']:,} changed, {rows['deleted']:,} "
                  f"deleted, {rows['added']:,} new ad-days in {wave_seconds:.1f} s; publish "
                  f"{walls[-1]:.2f} s: refresh {result.refresh_seconds:.2f} + copy "
                  f"{result.copy_seconds:.2f} + recording it {recording:.2f}"
                  f" ({result.changed_account_days:,} account-days"
                  f"{', healed ' + ', '.join(result.healed) if result.healed else ''}); (c) "
                  + ", ".join(f"{how} {times[-1]:.2f} s" for how, times in copies.items()))

        index = sorted(range(len(walls)), key=walls.__getitem__)[(len(walls) - 1) // 2]
        median, publish_s = publishes[index], walls[index]
        cp_s, flushed_s, renamed_s = (statistics.median(copies[how]) for how in COPIES)
        shutil.rmtree(copies_dir)
        staging = publisher.staging.stat().st_size
        print(f"snapshot {median.bytes / mb:,.0f} MB (first publish {first.bytes / mb:,.0f} MB, "
              f"staging file now {staging / mb:,.0f} MB); rows: "
              + ", ".join(f"{t} {n:,}" for t, n in median.rows.items()))
        print(f"median of {len(walls)} steady-state publishes: {publish_s:.2f} s = refresh "
              f"{median.refresh_seconds:.2f} s + copy {median.copy_seconds:.2f} s (copy, chmod, "
              f"fsync, rename, fsync dir) + recording it {publish_s - median.duration_seconds:.2f}"
              " s")
        print(f"medians of {len(walls)}: cp {cp_s:.2f} s ({median.bytes / mb / cp_s:,.0f} MB/s), "
              f"cp + fsync {flushed_s:.2f} s, cp + fsync + rename {renamed_s:.2f} s; the publish's"
              f" copy alone is {median.copy_seconds / renamed_s:.2f}x the last; the publish "
              f"{publish_s / renamed_s:.2f}x")
        holds = [r.refresh_seconds + wall - r.duration_seconds
                 for r, wall in zip(publishes, walls, strict=True)]
        print(f"(d) writes are unchanged; a publish holds the pipeline's file during its refresh "
              f"and while it records the publish: {statistics.median(holds):.2f} s (median; "
              f"longest {max(holds):.2f} s), the time a writer may wait. "
              f"First publish: {first.refresh_seconds:.1f} s")
        print("verify: snapshot against the pipeline")
        differ = verify(warehouse, target)
        if differ:
            raise SystemExit(f"the snapshot differs from the pipeline: {differ}")
        if twin is not None:
            print("verify: the snapshot published from PostgreSQL against the pipeline")
            differ = verify(warehouse, pg_target)
            if differ:
                raise SystemExit(f"the snapshot from PostgreSQL differs: {differ}")
            pg_median = statistics.median(pg["walls"])
            print("side by side (s)          DuckDB   PostgreSQL   goal")
            print(f"  first publish (whole)  {first.duration_seconds:7.1f}   "
                  f"{pg['first'].duration_seconds:10.1f}   <= 30")
            print(f"  a wave's publish       {publish_s:7.2f}   {pg_median:10.2f}   <= 2"
                  f"   (median of {len(walls)})")
            duck_refresh = statistics.median(r.refresh_seconds for r in publishes)
            pg_refresh = statistics.median(r.refresh_seconds for r in pg["results"])
            print(f"    of which the refresh {duck_refresh:7.2f}   {pg_refresh:10.2f}"
                  "          (the rest copies the file)")
            twin.close()
        leftovers = [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")]
        if leftovers:
            raise SystemExit(f"files left behind: {leftovers}")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"publish: {publish_s / flushed_s:.2f}x cp + fsync (goal <= {GOAL}x; "
              f"{publish_s / cp_s:.2f}x bare cp)")


def print_breakdown(result, log: list, parts: dict) -> None:
    print(f"breakdown of one more publish: {result.duration_seconds:.2f} s = refresh "
          f"{result.refresh_seconds:.2f} s + copy {result.copy_seconds:.2f} s")
    inside = parts.get("staging.refresh", 0.0)
    status = parts.get("planned_accounts", 0.0) + parts.get("status_table", 0.0)
    print(f"  refresh: planned_accounts {parts.get('planned_accounts', 0.0):.2f} s, status_table"
          f" {parts.get('status_table', 0.0):.2f} s, staging.refresh {inside:.2f} s, the rest "
          f"(open, ATTACH, CHECKPOINT, DETACH) {result.refresh_seconds - inside - status:.2f} s")
    for sql, seconds in sorted(log, key=lambda item: -item[1])[:12]:
        print(f"    {seconds * 1000:7.0f} ms  {sql[:110]}")
    copied = parts.get("shutil.copyfile", 0.0)
    print(f"  copy: shutil.copyfile {copied:.2f} s, chmod + fsync + rename + fsync dir "
          f"{result.copy_seconds - copied:.2f} s")


if __name__ == "__main__":
    main()
