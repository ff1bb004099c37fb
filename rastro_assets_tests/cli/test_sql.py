"""`rastro sql`: the analytics snapshot, read-only, in every format, never the pipeline's file."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import unicodedata
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import wcwidth

from rastro_assets.cli.sql_print import _duration
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.analytics.helpers import published_week
from rastro_assets_tests.analytics.sandbox import (
    analyst_folder,
    assert_a_writer_opens_it_now,
    listing,
)
from rastro_assets_tests.cli.conftest import assert_usage_error

HOLDER = (
    "import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('locked', flush=True);"
    " time.sleep(60)"
)
SPEND = (
    "SELECT ad_account_id, day, sum(spend) AS spend, sum(clicks) AS clicks"
    " FROM ad_spend_daily GROUP BY ALL ORDER BY ALL"
)


@pytest.fixture
def snapshot_path(request: pytest.FixtureRequest, duckdb_path: Path) -> Path:
    """The default snapshot: `analytics.duckdb` beside the pipeline's file."""
    return published_week(request, duckdb_path)


def in_snapshot(path: Path, query: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(query).fetchall()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_table_is_aligned_with_numbers_to_the_right(rastro, snapshot_path):
    code, out, err = rastro("sql", SPEND)
    assert (code, err) == (0, "")
    expected = in_snapshot(snapshot_path, SPEND)
    lines = out.splitlines()
    assert lines[0].split() == ["ad_account_id", "day", "spend", "clicks"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[-1] == f"({len(expected)} rows)"
    body = lines[2:-1]
    assert [line.split() for line in body] == [
        [account, day.isoformat(), str(spend), str(clicks)]
        for account, day, spend, clicks in expected
    ]
    # Every spend ends in the same column: right-aligned, all four decimals kept.
    spend_end = lines[0].index("spend") + len("spend")
    assert all(
        line[:spend_end].endswith(str(row[2])) for line, row in zip(body, expected, strict=True)
    )
    assert len({len(line) for line in body}) == 1


def test_table_shows_nulls_blobs_and_lists(rastro, snapshot_path):
    code, out, _ = rastro(
        "sql",
        "SELECT NULL AS nothing, t.image, s.sites FROM ad_thumbnails t,"
        " account_sync_status s WHERE s.ad_account_id = 'act_202' LIMIT 1",
    )
    assert code == 0
    row = out.splitlines()[2]
    size = in_snapshot(snapshot_path, "SELECT octet_length(image) FROM ad_thumbnails LIMIT 1")
    assert row.split(None, 1)[0] == "NULL"
    assert f"<blob: {size[0][0]} bytes>" in row and '["s1", "s2"]' in row


def test_csv_has_a_header_and_exact_decimals(rastro, snapshot_path):
    code, out, err = rastro("sql", SPEND, "--format", "csv")
    assert (code, err) == (0, "")
    parsed = list(csv.reader(io.StringIO(out)))
    assert parsed[0] == ["ad_account_id", "day", "spend", "clicks"]
    assert parsed[1:] == [
        [account, day.isoformat(), str(spend), str(clicks)]
        for account, day, spend, clicks in in_snapshot(snapshot_path, SPEND)
    ]
    assert all(len(row[2].split(".")[1]) == 4 for row in parsed[1:])


def test_csv_blobs_are_base64_and_nulls_empty(rastro, snapshot_path):
    query = "SELECT ad_id, image, NULL AS nothing FROM ad_thumbnails ORDER BY ad_id"
    code, out, _ = rastro("sql", query, "--format", "csv")
    assert code == 0
    parsed = list(csv.reader(io.StringIO(out)))[1:]
    assert [(ad, base64.b64decode(image), nothing) for ad, image, nothing in parsed] == [
        (ad, image, "") for ad, image, _ in in_snapshot(snapshot_path, query)
    ]


def test_json_is_one_array_with_decimals_as_strings(rastro, snapshot_path):
    code, out, err = rastro("sql", SPEND, "--format", "json")
    assert (code, err) == (0, "")
    entries = json.loads(out)
    assert entries == [
        {"ad_account_id": account, "day": day.isoformat(), "spend": str(spend), "clicks": clicks}
        for account, day, spend, clicks in in_snapshot(snapshot_path, SPEND)
    ]
    assert all(isinstance(entry["spend"], str) for entry in entries)
    assert (
        sum(Decimal(entry["spend"]) for entry in entries)
        == in_snapshot(snapshot_path, "SELECT sum(spend) FROM ad_spend_daily")[0][0]
    )


def test_json_timestamps_blobs_lists_and_intervals(rastro, snapshot_path):
    query = (
        "SELECT s.ad_account_id, s.sites, s.last_sync_at, t.image, INTERVAL 90 MINUTE AS wait,"
        " NULL AS nothing FROM account_sync_status s, (FROM ad_thumbnails LIMIT 1) t"
        " ORDER BY 1"
    )
    code, out, _ = rastro("sql", query, "--format", "json")
    assert code == 0
    entries = json.loads(out)
    expected = in_snapshot(snapshot_path, query)
    assert [entry["sites"] for entry in entries] == [["s1"], ["s1", "s2"]]
    for entry, row in zip(entries, expected, strict=True):
        assert datetime.fromisoformat(entry["last_sync_at"]) == row[2]
        assert datetime.fromisoformat(entry["last_sync_at"]).utcoffset() is not None
        assert base64.b64decode(entry["image"]) == row[3]
        assert entry["wait"] == "PT1H30M" and entry["nothing"] is None


def test_empty_results(rastro, snapshot_path):
    none = "SELECT * FROM sites WHERE false"
    assert rastro("sql", none, "--format", "json")[1] == "[]\n"
    assert rastro("sql", none, "--format", "csv")[1] == "site_id,name,created_at\n"
    assert rastro("sql", none)[1].splitlines()[-1] == "(0 rows)"


def test_the_query_may_come_from_stdin(rastro, snapshot_path):
    code, out, _ = rastro("sql", "-", "--format", "json", stdin="SELECT 1 AS one;\n")
    assert (code, json.loads(out)) == (0, [{"one": 1}])


def test_parquet_output_keeps_decimals_exact(rastro, snapshot_path, tmp_path: Path):
    target = tmp_path / "spend.parquet"
    code, out, err = rastro("sql", f"{SPEND}; -- by account and day", "--output", str(target))
    expected = in_snapshot(snapshot_path, SPEND)
    assert (code, err) == (0, "")
    assert out == f"wrote {len(expected)} rows to {target}\n"
    with duckdb.connect() as con:
        back = con.execute("SELECT * FROM read_parquet(?) ORDER BY ALL", [str(target)]).fetchall()
        spend_type = con.execute(
            "SELECT typeof(spend) FROM read_parquet(?) LIMIT 1", [str(target)]
        ).fetchone()[0]
    assert back == expected
    assert spend_type.startswith("DECIMAL") and isinstance(back[0][2], Decimal)
    assert sorted(path.name for path in target.parent.iterdir()) == ["data", "spend.parquet"]


def test_parquet_output_refuses_other_files_and_statements(rastro, snapshot_path, tmp_path):
    for name in ("spend.csv", "spend.json", "spend", "analytics.duckdb"):
        assert_usage_error(
            rastro("sql", SPEND, "--output", str(tmp_path / name)), "only Parquet", name
        )
    assert_usage_error(
        rastro("sql", SPEND, "--output", str(tmp_path / "x.parquet"), "--format", "csv"),
        "--format",
    )
    assert_usage_error(
        rastro("sql", SPEND, "--output", str(tmp_path / "nowhere" / "x.parquet")),
        "does not exist",
    )
    assert_usage_error(
        rastro("sql", "EXPLAIN SELECT 1", "--output", str(tmp_path / "x.parquet")), "SELECT"
    )
    broken = rastro(
        "sql", "SELECT error('boom') FROM range(10)", "--output", str(tmp_path / "x.parquet")
    )
    assert_usage_error(broken, "boom")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data"]


def test_a_missing_snapshot_is_one_line_and_never_created(rastro, duckdb_path: Path, tmp_path):
    # Neither file is there: the line says so, and never "not published yet".
    nothing = assert_usage_error(
        rastro("sql", "SELECT 1"),
        f"no analytics snapshot at {duckdb_path.parent / 'analytics.duckdb'}: no such file",
        f"nor is the pipeline's file at {duckdb_path}",
        "RASTRO_ANALYTICS_PATH",
    )
    assert "published yet" not in nothing
    Warehouse(duckdb_path).migrate()
    line = assert_usage_error(
        rastro("sql", "SELECT 1"),
        "no analytics snapshot has been published yet",
        str(duckdb_path.parent / "analytics.duckdb"),
        "to publish one now, run `rastro publish`",
    )
    assert "within minutes" in line
    elsewhere = tmp_path / "analysts" / "snap.duckdb"
    assert_usage_error(
        rastro("sql", "SELECT 1", environ={"RASTRO_ANALYTICS_PATH": str(elsewhere)}),
        str(elsewhere),
    )
    assert not (duckdb_path.parent / "analytics.duckdb").exists()
    assert not elsewhere.parent.exists()


def test_rastro_analytics_path_is_where_it_reads(rastro, snapshot_path, tmp_path):
    moved = tmp_path / "moved.duckdb"
    snapshot_path.rename(moved)
    assert rastro("sql", "SELECT 1")[0] == 2
    code, out, _ = rastro(
        "sql",
        "SELECT count(*) AS n FROM sites",
        "--format",
        "json",
        environ={"RASTRO_ANALYTICS_PATH": str(moved)},
    )
    assert (code, json.loads(out)) == (0, [{"n": 2}])


def test_bad_sql_is_one_line_with_duckdbs_message(rastro, snapshot_path):
    assert_usage_error(rastro("sql", "SELEC 1"), "Parser Error", "SELEC")
    line = assert_usage_error(rastro("sql", "SELECT * FROM meta_connections"), "Catalog Error")
    assert "meta_connections" in line
    assert_usage_error(rastro("sql", "SELECT error('boom') FROM sites"), "boom")
    assert_usage_error(rastro("sql", "  ;  "), "empty")
    assert_usage_error(rastro("sql", "SELECT 1; SELECT 2"), "one query at a time")


WRITES = (
    "INSERT INTO sites VALUES ('s9', 'Nine', now())",
    "DELETE FROM ad_spend_daily",
    "UPDATE ad_spend_daily SET spend = 0",
    "CREATE TABLE mine AS SELECT 1",
    "DROP TABLE ad_spend_daily",
    "COPY sites TO 'sites.csv'",
    "ATTACH 'other.duckdb' AS other",
    "SET threads = 1",
    "CHECKPOINT",
    "CALL duckdb_tables()",
    "DETACH analytics",
    "USE memory",
    "SELECT 1; DELETE FROM sites",
)


def test_a_write_is_refused_and_changes_nothing(
    rastro, snapshot_path, duckdb_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(snapshot_path.parent)  # where `sites.csv` or `other.duckdb` would land
    before = digest(snapshot_path), digest(duckdb_path)
    for statement in WRITES:
        assert_usage_error(rastro("sql", statement))
    line = assert_usage_error(rastro("sql", "DELETE FROM sites"), "DELETE", "read-only")
    assert "--output" in line
    assert (digest(snapshot_path), digest(duckdb_path)) == before
    assert sorted(path.name for path in snapshot_path.parent.iterdir()) == sorted(
        [snapshot_path.name, "rastro.duckdb", *hidden(snapshot_path.parent)]
    )


def hidden(directory: Path) -> list[str]:
    """The publisher's own files (staging, lock), which start with a dot."""
    return [path.name for path in directory.iterdir() if path.name.startswith(".")]


def test_the_connection_itself_is_read_only(snapshot_path):
    """Behind the statement check, DuckDB refuses writes on its own."""
    from rastro_assets.analytics.frames import open_snapshot

    with open_snapshot(snapshot_path) as con:
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("DELETE FROM ad_spend_daily")
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("INSERT INTO sites VALUES ('s9', 'Nine', now())")


KEY_TEXT = "c2VjcmV0LWtleS1ieXRlcy1ub2JvZHktc2hvdWxkLXJlYWQ="


@pytest.fixture
def beside(snapshot_path: Path, duckdb_path: Path) -> dict[str, Path]:
    """Files an analyst must never reach: the key and the pipeline's file beside the
    snapshot, and a CSV, a Parquet and a JSON file of their own next to them."""
    key = duckdb_path.parent / "secrets.key"
    key.write_text(KEY_TEXT)
    csv_file, parquet_file, json_file = (
        snapshot_path.parent / name for name in ("mine.csv", "mine.parquet", "mine.json")
    )
    csv_file.write_text("a,b\n1,2\n")
    json_file.write_text('{"a": 1}\n')
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT 1 AS a) TO '{parquet_file}' (FORMAT parquet)")
    return {
        "key": key,
        "pipeline": duckdb_path,
        "csv": csv_file,
        "parquet": parquet_file,
        "json": json_file,
    }


SANDBOXED = {
    "read_text of the key": ("SELECT content FROM read_text('{key}')", "{key}"),
    "read_blob of the pipeline": ("SELECT content FROM read_blob('{pipeline}')", "{pipeline}"),
    "read_text of /etc/passwd": ("SELECT content FROM read_text('/etc/passwd')", "/etc/passwd"),
    "glob": ("SELECT * FROM glob('{dir}/*')", "{dir}/*"),
    "read_csv": ("SELECT * FROM read_csv('{csv}')", "{csv}"),
    "a path as a table": ("SELECT * FROM '{csv}'", "{csv}"),
    "read_parquet": ("SELECT * FROM read_parquet('{parquet}')", "{parquet}"),
    "read_json": ("SELECT * FROM read_json('{json}')", "{json}"),
    "http": ("SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "http://127.0.0.1:9/x.csv"),
    "s3": ("SELECT * FROM 's3://bucket/x.parquet'", "s3://bucket/x.parquet"),
}


@pytest.mark.parametrize("name", SANDBOXED)
def test_no_file_nor_url_but_the_snapshot_is_reached(rastro, snapshot_path, beside, name):
    query, tried = SANDBOXED[name]
    places = {key: str(path) for key, path in beside.items()} | {"dir": str(snapshot_path.parent)}
    line = assert_usage_error(
        rastro("sql", query.format(**places), "--format", "csv"),
        "reads the analytics snapshot and nothing else",
        tried.format(**places),
    )
    assert KEY_TEXT not in line


def test_the_sandbox_holds_for_parquet_output_too(rastro, snapshot_path, beside, tmp_path):
    target = tmp_path / "leak.parquet"
    query = f"SELECT content FROM read_text('{beside['key']}')"
    assert_usage_error(rastro("sql", query, "--output", str(target)), str(beside["key"]))
    assert not target.exists() and not list(tmp_path.glob(".leak.parquet.*"))


def test_no_extension_is_installed_or_loaded(rastro, snapshot_path):
    for statement in ("INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL spatial"):
        assert_usage_error(rastro("sql", statement), "refused")
    # sqlite_scan lives in an extension DuckDB would otherwise install and load on its own.
    line = assert_usage_error(rastro("sql", "SELECT * FROM sqlite_scan('x.db', 't')"))
    assert "sqlite" in line
    code, out, _ = rastro(
        "sql",
        "SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access',"
        " 'autoinstall_known_extensions', 'autoload_known_extensions', 'lock_configuration')"
        " ORDER BY name",
        "--format",
        "csv",
    )
    assert code == 0
    assert out.splitlines()[1:] == [
        "autoinstall_known_extensions,false",
        "autoload_known_extensions,false",
        "enable_external_access,false",
        "lock_configuration,true",
    ]


def test_the_pipelines_file_is_never_opened(rastro, snapshot_path, duckdb_path: Path):
    assert_usage_error(
        rastro("sql", "SELECT 1", environ={"RASTRO_ANALYTICS_PATH": str(duckdb_path)}),
        "pipeline's own file",
    )


def test_it_runs_while_another_process_holds_the_pipelines_file(
    rastro, snapshot_path, duckdb_path: Path
):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(duckdb_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, out, err = rastro(
            "sql",
            "SELECT count(*) AS n, sum(spend) AS spend FROM ad_spend_daily",
            "--format",
            "json",
        )
        assert (code, err) == (0, ""), err
        [entry] = json.loads(out)
        assert entry["n"] > 0 and Decimal(entry["spend"]) > 0
        assert holder.poll() is None  # still holding it
    finally:
        holder.kill()
        holder.wait()


def test_sql_is_listed_in_help(rastro, capsys):
    assert rastro("sql", "--help")[0] == 0
    assert "--output FILE.parquet" in capsys.readouterr().out


def test_durations_are_iso_8601():
    assert _duration(timedelta(0)) == "PT0S"
    assert _duration(timedelta(days=1, hours=2, minutes=3, seconds=4.5)) == "P1DT2H3M4.5S"
    assert _duration(timedelta(days=30)) == "P30D"
    assert _duration(-timedelta(minutes=30)) == "-PT30M"


def test_explain_prints_the_plan_as_drawn(rastro, snapshot_path):
    code, out, _ = rastro("sql", "EXPLAIN SELECT * FROM sites")
    assert code == 0 and "\\n" not in out and len(out.splitlines()) > 3
    assert "SEQ_SCAN" in out.upper().replace(" ", "_")


def test_table_aligns_double_width_names(rastro, snapshot_path):
    code, out, err = rastro(
        "sql",
        "SELECT * FROM (VALUES ('夏のセール広告', 'é', 1.5), ('ad', '東京', 10.25))"
        " t(campaign_name, city, spend)",
    )
    assert (code, err) == (0, "")
    header, rule, *body, count = out.splitlines()
    assert count == "(2 rows)"
    # In a terminal a Japanese character takes two columns: each column starts where the
    # header's does, and the right-aligned spend ends in the same column on every line.
    city_at = display_columns(header[: header.index("city")])
    pairs = zip(body, ("é", "東京"), strict=True)
    cities = [display_columns(line[: line.index(city)]) for line, city in pairs]
    assert cities == [city_at, city_at]
    widths = {display_columns(line) for line in [header, rule, *body]}
    assert widths == {display_columns(header)}


def test_table_aligns_emoji_sequences_and_marks_by_what_a_terminal_draws(rastro, snapshot_path):
    """A ZWJ sequence, a flag, a heart with VS16, a full-width letter and a combining accent
    each take the columns a terminal gives them, not one per code point."""
    code, out, err = rastro(
        "sql",
        "SELECT * FROM (VALUES ('👩\u200d💻 dev', 'Ｓ', 1), ('🇧🇷 ❤\ufe0f', 'e\u0301', 22),"
        " ('夏のセール', 'ok', 333)) t(who, mark, n)",
    )
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "who         mark    n",
        "----------  ----  ---",
        "👩\u200d💻 dev      Ｓ      1",
        "🇧🇷 ❤\ufe0f       e\u0301      22",
        "夏のセール  ok    333",
        "(3 rows)",
    ]
    header, _, *body, _ = out.splitlines()
    starts = {name: wcwidth.wcswidth(header[: header.index(name)]) for name in ("mark", "n")}
    assert starts == {"mark": 12, "n": 20}
    for line, mark in zip(body, ("Ｓ", "e\u0301", "ok"), strict=True):
        assert wcwidth.wcswidth(line[: line.index(mark)]) == starts["mark"]
        assert wcwidth.wcswidth(line) == starts["n"] + 1


def test_table_writes_control_characters_out(rastro, snapshot_path):
    """An escape sequence in a value (an ad's name is Meta's to choose) reaches the terminal
    as text, and takes the columns its text does."""
    code, out, err = rastro(
        "sql", "SELECT chr(27) || '[31mred' || chr(7) AS name, 1 AS n UNION ALL SELECT 'x', 22"
    )
    assert (code, err) == (0, "")
    assert "\x1b" not in out and "\x07" not in out
    assert out.splitlines()[:4] == [
        "name" + " " * 14 + "n",
        "-" * 15 + "  --",
        "\\x1b[31mred\\x07   1",
        "x" + " " * 16 + "22",
    ]


def display_columns(text: str) -> int:
    return sum(
        2 if unicodedata.east_asian_width(char) in "WF" else 0 if unicodedata.combining(char)
        else 1
        for char in text
    )


# An analyst's folder decides nothing the sandbox may reach ----------------------------------


@pytest.mark.parametrize("target", ["root", "the key's folder"])
def test_a_tmp_symlink_in_the_working_directory_opens_nothing(
    rastro, snapshot_path, beside, tmp_path, monkeypatch, target
):
    key_folder = beside["key"].parent
    folder = analyst_folder(tmp_path, Path("/") if target == "root" else key_folder)
    monkeypatch.chdir(folder)
    before = listing(key_folder)
    reaching = {
        "SELECT content FROM read_text('/proc/self/environ')": "/proc/self/environ",
        f"SELECT content FROM read_text('{beside['key']}')": str(beside["key"]),
        f"SELECT content FROM read_blob('{beside['pipeline']}')": str(beside["pipeline"]),
        f"SELECT * FROM glob('{key_folder}/*')": f"{key_folder}/*",
        "SELECT content FROM read_text('.tmp/etc/passwd')": ".tmp/etc/passwd",
    }
    for query, tried in reaching.items():
        assert_usage_error(rastro("sql", query, "--format", "csv"), "nothing else", tried)
        target_file = folder / "p.parquet"
        line = assert_usage_error(rastro("sql", query, "--output", str(target_file)), tried)
        assert KEY_TEXT not in line and not target_file.exists()
    code, out, err = rastro(
        "sql",
        "SELECT current_setting('allowed_directories') AS d,"
        " current_setting('temp_directory') AS t",
        "--format",
        "json",
    )
    assert (code, json.loads(out), err) == (0, [{"d": [], "t": ""}], "")
    # The writer behind --output spills nowhere either, and writes only its file.
    code, _, err = rastro("sql", SPEND, "--output", str(folder / "spend.parquet"))
    assert (code, err) == (0, "")
    assert listing(key_folder) == before
    assert listing(folder) == [".tmp", "spend.parquet"]


def test_a_snapshot_with_the_pipelines_tables_is_refused_at_any_path(
    rastro, snapshot_path, duckdb_path: Path, tmp_path
):
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(duckdb_path, copy)
    link = tmp_path / "snapshot-of-sorts.duckdb"
    link.symlink_to(duckdb_path)
    # The pipeline's file under another name than RASTRO_DUCKDB_PATH says: its tables tell.
    elsewhere = str(tmp_path / "elsewhere" / "rastro.duckdb")
    for path in (copy, link):
        line = assert_usage_error(
            rastro(
                "sql",
                "SELECT connection_id, status FROM meta_connections",
                environ={"RASTRO_ANALYTICS_PATH": str(path), "RASTRO_DUCKDB_PATH": elsewhere},
            ),
            f"{path} holds the pipeline's own tables",
            "meta_connections",
        )
        assert "c1" not in line.split("meta_connections", 1)[1]
    assert_a_writer_opens_it_now(duckdb_path)


def test_output_never_replaces_a_file_unless_told(rastro, snapshot_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "spend.parquet"
    target.write_bytes(b"the analyst's own work")
    line = assert_usage_error(
        rastro("sql", SPEND, "--output", "spend.parquet"), str(target), "--replace"
    )
    assert "exists" in line
    assert target.read_bytes() == b"the analyst's own work"
    # A symlink there is a name taken too, and never written through.
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("untouched")
    linked = tmp_path / "linked.parquet"
    linked.symlink_to(elsewhere)
    assert_usage_error(rastro("sql", SPEND, "--output", str(linked)), str(linked), "--replace")
    assert elsewhere.read_text() == "untouched" and linked.is_symlink()

    code, out, err = rastro("sql", SPEND, "--output", "spend.parquet", "--replace")
    assert (code, err) == (0, ""), err
    with duckdb.connect() as con:
        back = con.execute("SELECT * FROM read_parquet(?) ORDER BY ALL", [str(target)]).fetchall()
    assert back == in_snapshot(snapshot_path, SPEND)
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".")) == []
    assert_usage_error(rastro("sql", SPEND, "--replace"), "--replace", "--output")
