"""`rastro accounts` and `rastro link` of many accounts, over real HTTP to the fake Graph.

The fake's token reaches 1,000 accounts, listed by `/me/adaccounts` in pages of at most
`PAGE_CAP` (the fake lowers any larger `limit`, as Meta does), into a real DuckDB file.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from rastro_assets import cli
from rastro_assets.cli.context import Context
from rastro_assets.cli.id_file import (
    FROM_FILE_MAX_CHARS,
    FROM_FILE_MAX_IDS,
    FROM_FILE_MAX_LINE_CHARS,
)
from rastro_assets.warehouse.link_store import MAX_LINKS_PER_CONNECTION
from rastro_assets_tests.cli.conftest import assert_usage_error

TOKEN = "EAAB0manyAccountsToken0123456789ab"
OTHER_TOKEN = "EAAB0otherAgencyToken9876543210zyx"
ACCOUNTS = 1000
PAGE_CAP = 100
CLOSED = 101


def act(number: int) -> str:
    return f"act_{10_000 + number}"


@pytest.fixture
def fake_world(fake_clock):
    """`TOKEN` reaches act_10001..act_11000; `OTHER_TOKEN` reaches act_10005 and act_10006."""
    from rastro_fake_graph.world import FakeWorld

    world = FakeWorld(clock=fake_clock, seed=11)
    world.max_page_size = PAGE_CAP
    for number in range(1, ACCOUNTS + 1):
        tokens = [TOKEN, OTHER_TOKEN] if number in (5, 6) else [TOKEN]
        world.add_account(
            act(number),
            timezone="Asia/Tokyo" if number % 2 else "America/Sao_Paulo",
            currency="JPY" if number % 2 else "BRL",
            name=f"Loja {number}",
            n_ads=0,
            token=tokens,
            account_status=CLOSED if number == 3 else 1,
        )
    world.add_account("act_77", timezone="UTC", currency="USD", n_ads=0, token=OTHER_TOKEN)
    return world


@pytest.fixture
def rastro_environ(
    monkeypatch: pytest.MonkeyPatch, duckdb_path: Path, secrets_key: str, fake_graph
) -> Mapping[str, str]:
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(duckdb_path))
    monkeypatch.setenv("RASTRO_META_GRAPH_URL", fake_graph.base_url)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("RASTRO_META_FAKE", raising=False)
    return os.environ


@pytest.fixture
def never_printed() -> tuple[str, ...]:
    return TOKEN, OTHER_TOKEN


@pytest.fixture
def registered(rastro, fake_world):
    """Sites s1 and s2; connections c1 (TOKEN) and c2 (OTHER_TOKEN), checked with Meta."""
    assert rastro("site", "add", "s1")[0] == 0
    assert rastro("site", "add", "s2")[0] == 0
    assert rastro("connect", "c1", stdin=TOKEN)[0] == 0
    assert rastro("connect", "c2", stdin=OTHER_TOKEN)[0] == 0
    return fake_world


def stored(path: Path, query: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(query).fetchall()


def snapshot(path: Path) -> dict[str, list[tuple]]:
    """Every table a link writes, to show that a refused command wrote nothing."""
    if not path.exists():
        return {}
    tables = ("sites", "meta_connections", "meta_ad_accounts", "ad_account_shards",
              "site_ad_accounts")
    return {table: stored(path, f"SELECT * FROM {table} ORDER BY ALL") for table in tables}


def links(path: Path) -> list[tuple[str, str]]:
    return stored(path, "SELECT site_id, ad_account_id FROM site_ad_accounts ORDER BY ALL")


def refusals(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rastro: error: ")]


# accounts -------------------------------------------------------------------------


def test_accounts_lists_every_page_with_where_each_is_linked(rastro, registered, fake_world):
    assert rastro("link", "s1", act(1), "--connection", "c1")[0] == 0
    assert rastro("link", "s2", act(1), "--connection", "c1")[0] == 0
    assert rastro("link", "s2", act(5), "--connection", "c2")[0] == 0
    requests = fake_world.record_requests()

    code, out, err = rastro("accounts", "c1")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == ["ACCOUNT", "NAME", "CURRENCY", "TIMEZONE", "STATUS", "LINKED", "TO"]
    assert len(rows) == ACCOUNTS
    by_id = {row.split()[0]: row.split() for row in rows}
    assert by_id[act(1)][1:] == ["Loja", "1", "JPY", "Asia/Tokyo", "ACTIVE", "s1,s2"]
    assert by_id[act(3)][-2:] == ["CLOSED", "-"]
    assert by_id[act(5)][-3:] == ["s2", "(via", "c2)"]
    pages = sum(1 for request in requests if request.endpoint == "adaccounts")
    assert pages >= ACCOUNTS // PAGE_CAP
    assert {request.endpoint for request in requests} == {"adaccounts"}

    code, out, err = rastro("accounts", "c1", "--json")
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert [entry["ad_account_id"] for entry in listed] == sorted(act(n) for n in range(1, 1001))
    first = next(entry for entry in listed if entry["ad_account_id"] == act(1))
    assert first == {
        "ad_account_id": act(1), "name": "Loja 1", "currency": "JPY", "timezone": "Asia/Tokyo",
        "status": "ACTIVE", "account_status": 1, "sites": ["s1", "s2"], "connection_id": "c1",
    }
    fifth = next(entry for entry in listed if entry["ad_account_id"] == act(5))
    assert (fifth["sites"], fifth["connection_id"]) == (["s2"], "c2")
    third = next(entry for entry in listed if entry["ad_account_id"] == act(3))
    assert (third["status"], third["account_status"], third["sites"]) == ("CLOSED", CLOSED, [])


@pytest.mark.parametrize("args", [("accounts", "c1"), ("accounts", "c1", "--json")])
def test_accounts_with_a_dead_token_is_one_line_and_writes_nothing(
    rastro, registered, fake_world, duckdb_path, args
):
    fake_world.kill_token(TOKEN)
    before = snapshot(duckdb_path)
    assert_usage_error(rastro(*args), "Meta refused the token of connection 'c1'", "190",
                       "rastro connect c1")
    assert snapshot(duckdb_path) == before


def test_accounts_of_a_missing_connection_or_a_meta_failure_is_one_line(
    rastro, registered, fake_world, duckdb_path
):
    before = snapshot(duckdb_path)
    assert_usage_error(rastro("accounts", "c9"), "unknown connection 'c9'")
    fake_world.fail("adaccounts", "permission", skip=2)
    assert_usage_error(rastro("accounts", "c1"), "could not list", "'c1'", "code 200")
    assert snapshot(duckdb_path) == before


@pytest.mark.timeout(60)  # without bounds, these never end: fail in a minute instead
@pytest.mark.parametrize(
    ("fault", "fragment"),
    [
        ("endless_paging", "Meta kept paging GET me/adaccounts past 20 pages; stopped"),
        ("slow_body", "Meta's answers to GET me/adaccounts took over 1s in all; stopped"),
        ("huge_body", "GET me/adaccounts is over the 4,194,304-byte cap; not read further"),
    ],
)
def test_accounts_stops_at_its_page_cap_deadline_and_body_cap(
    rastro, registered, fake_world, duckdb_path, monkeypatch, fault, fragment
):
    # Small page and time bounds, so the test takes a second; the body cap is the real one.
    from rastro_assets.meta import client

    bounds = replace(client.ACCOUNT_LISTING_BOUNDS, max_pages=20, seconds=1)
    monkeypatch.setattr(client, "ACCOUNT_LISTING_BOUNDS", bounds)
    fake_world.slow_body_byte_seconds = 0.01
    fake_world.huge_body_bytes = 50 << 20
    fake_world.fail("adaccounts", fault, times=None, skip=1)
    before = snapshot(duckdb_path)
    for args in (("accounts", "c1"), ("link", "s1", "--all", "--connection", "c1")):
        assert_usage_error(rastro(*args), "could not list", "'c1'", fragment)
    assert snapshot(duckdb_path) == before


def test_accounts_before_the_warehouse_exists_creates_nothing(rastro, duckdb_path, fake_graph):
    assert_usage_error(rastro("accounts", "c1"), "unknown connection 'c1'")
    assert not duckdb_path.exists()


# link, many -------------------------------------------------------------------------


def test_link_many_ids_reads_the_listing_not_each_account(rastro, registered, fake_world,
                                                          duckdb_path):
    requests = fake_world.record_requests()
    code, out, err = rastro("link", "s1", act(1), "10002", act(2), "--connection", "c1")
    assert (code, err) == (0, "")
    assert f"linked s1 to {act(1)} (Asia/Tokyo, JPY) via c1" in out
    assert f"linked s1 to {act(2)} (America/Sao_Paulo, BRL) via c1" in out
    assert out.splitlines()[-1] == "s1: 2 linked, 0 already linked, 0 refused (via c1)"
    assert Counter(request.endpoint for request in requests).keys() == {"adaccounts"}
    assert stored(duckdb_path, "SELECT ad_account_id, timezone, currency, name, connection_id"
                               " FROM meta_ad_accounts ORDER BY 1") == [
        (act(1), "Asia/Tokyo", "JPY", "Loja 1", "c1"),
        (act(2), "America/Sao_Paulo", "BRL", "Loja 2", "c1"),
    ]


def test_the_501st_link_of_a_connection_is_refused_naming_it(rastro, registered, duckdb_path):
    ids = [act(n) for n in range(1, MAX_LINKS_PER_CONNECTION + 2)]
    code, out, err = rastro("link", "s1", *ids, "--connection", "c1")
    assert code == 2
    [line] = refusals(err)
    assert line.startswith(f"rastro: error: {ids[-1]}: connection 'c1' already holds 500 links")
    assert len(links(duckdb_path)) == MAX_LINKS_PER_CONNECTION
    assert (ids[-1],) not in stored(duckdb_path, "SELECT ad_account_id FROM meta_ad_accounts")
    assert out.splitlines()[-1] == "s1: 500 linked, 0 already linked, 1 refused (via c1)"

    # Linking an existing link again is still a no-op that succeeds; a new one, one line.
    assert rastro("link", "s1", ids[0], ids[1], "--connection", "c1")[0] == 0
    single = rastro("link", "s1", ids[-1], "--connection", "c1")
    assert_usage_error(single, ids[-1], "already holds 500 links")


def test_link_all_links_every_reachable_account_no_site_links(rastro, registered, fake_world,
                                                              duckdb_path):
    assert rastro("link", "s2", act(6), "--connection", "c1")[0] == 0
    code, out, err = rastro("link", "s1", "--all", "--connection", "c2")
    assert (code, err) == (0, "")
    assert links(duckdb_path) == [("s1", act(5)), ("s1", "act_77"), ("s2", act(6))]
    assert out.splitlines()[-1] == "s1: 2 linked, 0 already linked, 0 refused (via c2)"
    assert rastro("link", "s1", "--all", "--connection", "c2") == (
        0, "nothing to link: every account connection c2's token reaches is linked already\n", ""
    )


def test_link_all_stops_at_the_connections_limit(rastro, registered, duckdb_path):
    code, out, err = rastro("link", "s1", "--all", "--connection", "c1")
    assert code == 2
    lines = refusals(err)
    assert len(lines) == ACCOUNTS - MAX_LINKS_PER_CONNECTION
    assert all("already holds 500 links" in line for line in lines)
    assert len(links(duckdb_path)) == MAX_LINKS_PER_CONNECTION


def test_link_from_a_file_and_from_stdin(rastro, registered, duckdb_path, tmp_path):
    listing = tmp_path / "ids.txt"
    listing.write_text(f"# the shop's accounts\n\n{act(1)}\n  10002  # the second\n\n#{act(3)}\n")
    code, out, err = rastro("link", "s1", "--from-file", str(listing), "--connection", "c1")
    assert (code, err) == (0, "")
    assert links(duckdb_path) == [("s1", act(1)), ("s1", act(2))]
    code, _, err = rastro("link", "s2", "--from-file", "-", "--connection", "c1",
                          stdin=f"{act(4)}\n{act(1)}\n")
    assert (code, err) == (0, "")
    assert ("s2", act(4)) in links(duckdb_path)
    missing = rastro("link", "s1", "--from-file", str(tmp_path / "nope"), "--connection", "c1")
    assert_usage_error(missing, "cannot read --from-file", "nope")


class EndlessText(io.TextIOBase):
    """A stdin that never ends: `line` again and again, counting what was read from it."""

    def __init__(self, line: str) -> None:
        self.line = line
        self.read_chars = 0

    def readable(self) -> bool:
        return True

    def _more(self, size: int) -> str:
        # Past this, the command is reading without bound: stop it here, not at the OOM killer.
        assert self.read_chars < 64 * FROM_FILE_MAX_CHARS, "read without bound"
        text = (self.line * (size // len(self.line) + 1))[:size]
        self.read_chars += len(text)
        return text

    def read(self, size: int | None = -1) -> str:
        return self._more(1 << 20 if size is None or size < 0 else size)

    def readline(self, size: int | None = -1) -> str:
        if size is None or size < 0 or size >= len(self.line):
            return self._more(len(self.line))
        return self._more(size)


def link_from_stdin(stdin: io.TextIOBase, environ: Mapping[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(environ=dict(environ), stdin=stdin, stdout=out, stderr=err)
    code = cli.run(["link", "s1", "--from-file", "-", "--connection", "c1"], ctx)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("line", "fragment"),
    [(f"{act(1)}\n", "more than 600 ids"), ("\n", "over 262,144 characters"), ("\0", "NUL")],
)
def test_an_endless_stdin_is_read_only_so_far_and_links_nothing(
    rastro_environ, registered, fake_world, duckdb_path, line, fragment
):
    before = snapshot(duckdb_path)
    requests = fake_world.record_requests()
    endless = EndlessText(line)
    assert_usage_error(link_from_stdin(endless, rastro_environ), "--from-file '-'", fragment)
    assert endless.read_chars <= FROM_FILE_MAX_CHARS + FROM_FILE_MAX_LINE_CHARS + 1
    assert requests == []
    assert snapshot(duckdb_path) == before


def test_a_file_of_nul_bytes_or_one_long_line_is_refused(
    rastro, registered, fake_world, duckdb_path, tmp_path
):
    before = snapshot(duckdb_path)
    requests = fake_world.record_requests()
    zeros = tmp_path / "zeros"
    with zeros.open("wb") as file:  # reads as /dev/zero does, for as far as it goes
        file.truncate(64 << 20)
    long_line = tmp_path / "long.txt"
    long_line.write_text(f"{act(1)}  # {'x' * FROM_FILE_MAX_LINE_CHARS}\n{act(2)}\n")
    for path, fragment in ((zeros, "NUL bytes"), (long_line, "longer than 512")):
        line = assert_usage_error(
            rastro("link", "s1", "--from-file", str(path), "--connection", "c1"), fragment
        )
        assert len(line) < 300
    assert requests == []
    assert snapshot(duckdb_path) == before


def test_a_file_naming_more_than_a_connection_may_link_links_nothing_and_asks_nothing(
    rastro, registered, fake_world, duckdb_path, tmp_path
):
    before = snapshot(duckdb_path)
    requests = fake_world.record_requests()
    unknown = tmp_path / "ids.txt"
    unknown.write_text("".join(f"act_{900_000 + n}\n" for n in range(FROM_FILE_MAX_IDS + 1)))
    assert_usage_error(
        rastro("link", "s1", "--from-file", str(unknown), "--connection", "c1"),
        f"more than {FROM_FILE_MAX_IDS} ids", f"at most {MAX_LINKS_PER_CONNECTION} links",
    )
    assert requests == []
    assert snapshot(duckdb_path) == before
    # As many as a connection may link, with comments and blank lines, is read in full.
    within = tmp_path / "within.txt"
    within.write_text("# ours\n\n" + "".join(f"{act(n)}  # n\n" for n in range(1, 4)) * 150)
    code, out, err = rastro("link", "s1", "--from-file", str(within), "--connection", "c1")
    assert (code, err) == (0, "")
    assert links(duckdb_path) == [("s1", act(1)), ("s1", act(2)), ("s1", act(3))]


def test_a_bad_id_among_good_ones_is_refused_alone(rastro, registered, duckdb_path):
    code, out, err = rastro("link", "s1", act(1), "act_x1", act(2), "--connection", "c1")
    assert code == 2
    [line] = refusals(err)
    assert "'act_x1'" in line and "act_<digits>" in line
    assert links(duckdb_path) == [("s1", act(1)), ("s1", act(2))]
    assert "1 refused" in out


def test_an_account_synced_through_another_connection_is_refused(rastro, registered,
                                                                 duckdb_path):
    assert rastro("link", "s2", act(5), "--connection", "c2")[0] == 0
    code, _, err = rastro("link", "s1", act(4), act(5), act(6), "--connection", "c1")
    assert code == 2
    [line] = refusals(err)
    assert line.startswith(f"rastro: error: {act(5)}: already synced through connection 'c2'")
    assert links(duckdb_path) == [("s1", act(4)), ("s1", act(6)), ("s2", act(5))]


def test_accounts_the_token_does_not_reach_are_refused(rastro, registered, fake_world,
                                                      duckdb_path):
    requests = fake_world.record_requests()
    code, _, err = rastro("link", "s1", act(1), "act_77", "act_424242", "--connection", "c1")
    assert code == 2
    lines = refusals(err)
    assert [line.split()[2] for line in lines] == ["act_77:", "act_424242:"]
    assert all("token does not reach it" in line for line in lines)
    assert links(duckdb_path) == [("s1", act(1))]
    assert sorted(r.account for r in requests if r.endpoint == "account") == [
        "act_424242", "act_77"
    ]


def test_link_many_with_a_dead_token_is_one_line_and_writes_nothing(
    rastro, registered, fake_world, duckdb_path
):
    fake_world.kill_token(TOKEN)
    before = snapshot(duckdb_path)
    for args in ((act(1), act(2)), ("--all",)):
        result = rastro("link", "s1", *args, "--connection", "c1")
        assert_usage_error(result, "Meta refused the token of connection 'c1'")
    assert snapshot(duckdb_path) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("link", "s1", "--connection", "c1"), "no ad account to link"),
        (("link", "s1", act(1), "--all", "--connection", "c1"), "--all"),
        (("link", "s1", "--all", "--no-verify", "--connection", "c1"), "--no-verify"),
        (("link", "s1", act(1), act(2), "--no-verify", "--connection", "c1"), "--timezone and"),
        (("link", "s9", act(1), act(2), "--connection", "c1"), "unknown site 's9'"),
        (("link", "s1", act(1), act(2), "--connection", "c9"), "unknown connection 'c9'"),
    ],
)
def test_bad_many_link_inputs(rastro, registered, duckdb_path, args, fragment):
    before = snapshot(duckdb_path)
    assert_usage_error(rastro(*args), fragment)
    assert snapshot(duckdb_path) == before


def test_many_ids_with_timezone_and_currency_given_need_no_meta(rastro, registered, fake_world,
                                                               duckdb_path):
    requests = fake_world.record_requests()
    code, _, err = rastro("link", "s1", "9001", "9002", "--connection", "c1", "--no-verify",
                          "--timezone", "UTC", "--currency", "usd")
    assert (code, err) == (0, "")
    assert requests == []
    assert stored(duckdb_path, "SELECT DISTINCT timezone, currency FROM meta_ad_accounts") == [
        ("UTC", "USD")
    ]


def test_a_single_id_still_reads_its_own_account(rastro, registered, fake_world, duckdb_path):
    requests = fake_world.record_requests()
    code, out, err = rastro("link", "s1", act(2), "--connection", "c1")
    assert (code, err) == (0, "")
    assert out == f"linked s1 to {act(2)} (America/Sao_Paulo, BRL) via c1\n"
    assert [(r.endpoint, r.account) for r in requests] == [("account", act(2))]
    assert rastro("link", "s1", act(2), "--connection", "c1") == (
        0, f"s1 is already linked to {act(2)}; nothing to do\n", ""
    )


def test_many_ids_register_their_partitions_once_per_shard_per_batch(
    rastro, registered, monkeypatch, tmp_path, duckdb_path
):
    import dagster as dg

    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    calls: list[tuple[str, int]] = []
    original = dg.DagsterInstance.add_dynamic_partitions

    def counted(self, name, keys):
        calls.append((name, len(keys)))
        return original(self, name, keys)

    monkeypatch.setattr(dg.DagsterInstance, "add_dynamic_partitions", counted)
    sized = {"RASTRO_ACCOUNT_SHARDS": "2", "RASTRO_SHARD_ACCOUNTS": "3"}
    ids = [act(n) for n in range(1, 6)]
    code, _, err = rastro("link", "s1", *ids, "--connection", "c1", environ=sized)
    assert (code, err) == (0, "")
    assert stored(duckdb_path, "SELECT ad_account_id, shard FROM ad_account_shards ORDER BY 1") == [
        (ids[0], 0), (ids[1], 0), (ids[2], 0), (ids[3], 1), (ids[4], 1)
    ]
    assert sorted(calls) == [
        ("meta_ad_account", 3), ("meta_ad_account_all", 5), ("meta_ad_account_shard_1", 2)
    ]
    with dg.DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions("meta_ad_account") == ids[:3]
        assert instance.get_dynamic_partitions("meta_ad_account_shard_1") == ids[3:]
