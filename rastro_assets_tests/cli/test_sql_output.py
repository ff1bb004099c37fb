"""`rastro sql --output`: a size cap, never inside the product's own directories, `--replace`
only over a regular file of the invoking user's; and analysts of a group read the snapshot
as themselves."""

from __future__ import annotations

import json
import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rastro_assets import cli
from rastro_assets.analytics.publish import Publisher
from rastro_assets.cli.context import Context
from rastro_assets_tests.analytics.helpers import publish_week, published_week
from rastro_assets_tests.cli.conftest import assert_usage_error

SPEND = "SELECT ad_account_id, day, sum(spend) AS spend FROM ad_spend_daily GROUP BY ALL"
# About 30 MB of Parquet (hashes do not compress); 1 MiB is far below it.
BIG = "SELECT md5(range::VARCHAR) AS h, range AS i FROM range(1000000)"
ONE_MIB = {"RASTRO_SQL_OUTPUT_MAX_MB": "1"}
NOBODY = 65534


@pytest.fixture
def snapshot_path(request: pytest.FixtureRequest, duckdb_path: Path) -> Path:
    return published_week(request, duckdb_path)


def leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith("."))


# The size cap --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_result_past_the_cap_stops_and_leaves_nothing(rastro, snapshot_path, tmp_path):
    target = tmp_path / "big.parquet"
    assert_usage_error(
        rastro("sql", BIG, "--output", str(target), environ=ONE_MIB),
        f"--output {target}: the result is over 1 MiB (RASTRO_SQL_OUTPUT_MAX_MB); nothing written",
    )
    assert not target.exists() and leftovers(tmp_path) == []
    # A file being replaced stays as it was.
    target.write_bytes(b"the analyst's own work")
    assert_usage_error(
        rastro("sql", BIG, "--output", str(target), "--replace", environ=ONE_MIB), "over 1 MiB"
    )
    assert target.read_bytes() == b"the analyst's own work" and leftovers(tmp_path) == []
    # Under the cap, it writes.
    code, out, err = rastro("sql", SPEND, "--output", str(target), "--replace", environ=ONE_MIB)
    assert (code, err) == (0, "") and out.startswith("wrote ")


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "lots", "99999999999999999999", "1048577"])
def test_a_bad_cap_is_one_line_naming_it(rastro, tmp_path, value):
    target = tmp_path / "x.parquet"
    assert_usage_error(
        rastro("sql", SPEND, "--output", str(target), environ={"RASTRO_SQL_OUTPUT_MAX_MB": value}),
        "RASTRO_SQL_OUTPUT_MAX_MB must be a whole number of MiB from 1 to 1,048,576",
        repr(value),
    )
    assert not target.exists()


# Never inside the product's directories ------------------------------------------------------


def test_the_products_directories_are_refused_however_reached(
    rastro, snapshot_path, duckdb_path, tmp_path
):
    data = duckdb_path.parent
    (data / "deeper").mkdir()
    (tmp_path / "data-link").symlink_to(data, target_is_directory=True)
    home = tmp_path / "dagster_home"
    (home / "storage").mkdir(parents=True)
    before = sorted(path.name for path in data.iterdir())
    for target, place in [
        (data / "spend.parquet", "RASTRO_DUCKDB_PATH"),
        (data / "deeper" / "spend.parquet", "RASTRO_DUCKDB_PATH"),
        (tmp_path / "data-link" / "spend.parquet", "RASTRO_DUCKDB_PATH"),
        (home / "storage" / "spend.parquet", "DAGSTER_HOME"),
    ]:
        assert_usage_error(
            rastro("sql", SPEND, "--output", str(target), environ={"DAGSTER_HOME": str(home)}),
            f"--output {target} is inside {data if place != 'DAGSTER_HOME' else home}",
            place, "write it elsewhere",
        )
    assert sorted(path.name for path in data.iterdir()) == before
    assert list((data / "deeper").iterdir()) == [] and list((home / "storage").iterdir()) == []


def test_the_snapshots_own_directory_is_refused(
    rastro, syncer, warehouse, fake_clock, tmp_path
):
    analysts = tmp_path / "analysts"
    snapshot = publish_week(syncer, warehouse, analysts / "analytics.duckdb", fake_clock)
    environ = {"RASTRO_ANALYTICS_PATH": str(snapshot)}
    assert_usage_error(
        rastro("sql", SPEND, "--output", str(analysts / "x.parquet"), environ=environ),
        f"is inside {analysts}", "RASTRO_ANALYTICS_PATH",
    )
    code, _, err = rastro("sql", SPEND, "--output", str(tmp_path / "x.parquet"), environ=environ)
    assert (code, err) == (0, "")


def test_an_analysts_own_data_folder_is_no_guess_of_the_pipelines(
    rastro, snapshot_path, tmp_path, monkeypatch
):
    folder = tmp_path / "ana"
    (folder / "data").mkdir(parents=True)
    monkeypatch.chdir(folder)
    environ = {"RASTRO_DUCKDB_PATH": "", "RASTRO_ANALYTICS_PATH": str(snapshot_path)}
    code, _, err = rastro("sql", SPEND, "--output", "data/spend.parquet", environ=environ)
    assert (code, err) == (0, "")
    assert (folder / "data" / "spend.parquet").is_file()


# --replace: a regular file of yours ----------------------------------------------------------


def test_replace_refuses_links_and_what_is_no_regular_file(rastro, snapshot_path, tmp_path):
    elsewhere = tmp_path / "elsewhere.parquet"
    elsewhere.write_bytes(b"someone's")
    link = tmp_path / "link.parquet"
    link.symlink_to(elsewhere)
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    for target, kind in ((link, "a symbolic link"), (fifo, "not a regular file")):
        assert_usage_error(
            rastro("sql", SPEND, "--output", str(target), "--replace"),
            f"--replace replaces only a regular file of yours: {target} is {kind}",
        )
    assert link.is_symlink() and elsewhere.read_bytes() == b"someone's"
    assert fifo.exists() and leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")
def test_replace_refuses_another_users_file(rastro, snapshot_path, tmp_path):
    theirs = tmp_path / "theirs.parquet"
    theirs.write_bytes(b"their work")
    os.chown(theirs, NOBODY, -1)
    assert_usage_error(
        rastro("sql", SPEND, "--output", str(theirs), "--replace"),
        f"--replace replaces only a file of yours: {theirs} belongs to uid {NOBODY}",
    )
    assert theirs.read_bytes() == b"their work"


# Analysts read the snapshot as themselves, through a group -----------------------------------


def as_user(uid: int, gid: int, args: list[str], environ: dict[str, str]) -> tuple[int, str]:
    """`rastro ARGS` in a child process running as `uid` with only group `gid`: the exit
    code and what it printed (stdout, then stderr)."""
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        code = 70
        try:
            os.close(reading)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.chdir("/")
            out = err = _Text()
            code = cli.run(args, Context(environ=environ, stdin=_Text(), stdout=out, stderr=err))
            os.write(writing, out.getvalue().encode())
        finally:
            os._exit(code)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        printed = pipe.read().decode()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status), printed


class _Text:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def read(self) -> str:
        return ""

    def flush(self) -> None:
        pass

    def getvalue(self) -> str:
        return "".join(self.parts)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory outside root's private temporary tree, that other users can enter."""
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        os.chmod(name, 0o711)
        yield Path(name)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as other users takes root")
def test_an_analyst_in_the_snapshots_group_reads_it_as_themselves(
    syncer, warehouse, fake_clock, shared_dir: Path, duckdb_path: Path
):
    group = pwd.getpwuid(NOBODY).pw_gid
    analysts = shared_dir / "analytics"
    analysts.mkdir()
    os.chown(analysts, 0, group)
    os.chmod(analysts, 0o2750)  # the documented setup: setgid, the analysts' group
    publish_week(syncer, warehouse, analysts / "analytics.duckdb", fake_clock)
    Publisher(warehouse, analysts / "analytics.duckdb", mode=0o640).publish()
    snapshot = analysts / "analytics.duckdb"
    info = snapshot.stat()
    assert (info.st_gid, info.st_mode & 0o777) == (group, 0o440)
    assert duckdb_path.stat().st_mode & 0o077 == 0

    environ = {"RASTRO_ANALYTICS_PATH": str(snapshot)}
    query = ["sql", "SELECT count(*) AS n FROM sites", "--format", "json"]
    code, printed = as_user(NOBODY, group, query, environ)
    assert (code, json.loads(printed)) == (0, [{"n": 2}])
    # Not in the group: one line, nothing read.
    code, printed = as_user(NOBODY, 1, query, environ)
    assert code == 2
    assert printed.startswith("rastro: error: ") and "Permission denied" in printed
