"""The `rastro` command: happy paths, and every bad input as one line, exit 2, nothing written."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.models import AdAccount
from rastro_assets.vault import ENV_VAR, Vault
from rastro_assets.warehouse import engines, registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import assert_usage_error
from rastro_assets_tests.conftest import record_sync_run

TOKEN = "EAAB0rastroTestToken0123456789abcdef"
NEW_TOKEN = "EAAB0rastroNewToken9876543210fedcba"

HOLDER = (
    "import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('locked', flush=True);"
    " time.sleep(30)"
)

TABLES = (
    "sites",
    "meta_connections",
    "meta_ad_accounts",
    "site_ad_accounts",
    "ad_spend_daily",
    "site_spend_daily",
)


class FakeMeta:
    """Stands in for `rastro_assets.meta.make_client`; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.accounts = {"act_77": AdAccount("act_77", "Shop", "brl", "America/Sao_Paulo")}
        self.refuse: MetaError | None = None

    def make_client(self, settings, token: str) -> FakeMeta.Client:
        return FakeMeta.Client(self, token)

    class Client:
        def __init__(self, meta: FakeMeta, token: str) -> None:
            self.meta, self.token = meta, token

        def check_token(self) -> None:
            self.meta.calls.append(("check_token", self.token))
            if self.meta.refuse:
                raise self.meta.refuse

        def account(self, ad_account_id: str) -> AdAccount:
            self.meta.calls.append(("account", self.token, ad_account_id))
            if self.meta.refuse:
                raise self.meta.refuse
            if ad_account_id not in self.meta.accounts:
                raise MetaError(ErrorKind.PERMISSION, f"no access to {ad_account_id}", code=200)
            return self.meta.accounts[ad_account_id]

        def close(self) -> None:
            self.meta.calls.append(("close",))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, duckdb_path: Path, secrets_key: str) -> Path:
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(duckdb_path))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("RASTRO_META_FAKE", raising=False)
    return duckdb_path


@pytest.fixture
def meta(monkeypatch: pytest.MonkeyPatch) -> FakeMeta:
    fake = FakeMeta()
    monkeypatch.setattr("rastro_assets.meta.make_client", fake.make_client, raising=False)
    return fake


@pytest.fixture
def rastro_environ(env: Path) -> Mapping[str, str]:
    """The process environment, as the console script sees it, read at each run."""
    return os.environ


@pytest.fixture
def never_printed() -> tuple[str, ...]:
    return TOKEN, NEW_TOKEN


def snapshot(path: Path) -> dict[str, list[tuple]]:
    if not path.exists():
        return {}
    with Warehouse(path).connect(read_only=True) as con:
        queries = {
            "sites": "SELECT * FROM sites ORDER BY ALL",
            "meta_connections": "SELECT * FROM meta_connections ORDER BY ALL",
            "meta_ad_accounts": "SELECT * FROM meta_ad_accounts ORDER BY ALL",
            "site_ad_accounts": "SELECT * FROM site_ad_accounts ORDER BY ALL",
            "ad_spend_daily": "SELECT * FROM ad_spend_daily ORDER BY ALL",
            "site_spend_daily": "SELECT * FROM site_spend_daily ORDER BY ALL",
        }
        return {table: con.execute(queries[table]).fetchall() for table in TABLES}


@pytest.fixture
def world(rastro) -> None:
    """Site s1, connection c1 (unverified), no links."""
    assert rastro("site", "add", "s1", "--name", "Site one")[0] == 0
    assert rastro("connect", "c1", "--no-verify", stdin=f"{TOKEN}\n")[0] == 0


def stored(where, query: str) -> list[tuple]:
    """`query`'s rows, from the file at a path or from the test's warehouse of either engine."""
    if isinstance(where, Path):
        with duckdb.connect(str(where), read_only=True) as con:
            return con.execute(query).fetchall()
    with where.connect(read_only=True) as con:
        return con.execute(query).fetchall()


# keygen and site ----------------------------------------------------------------


def test_keygen_prints_a_usable_key_and_writes_nothing(rastro, env: Path):
    code, out, err = rastro("keygen")
    assert (code, err) == (0, "")
    key = out.strip()
    assert len(base64.b64decode(key, validate=True)) == 32
    Vault.from_env({ENV_VAR: key})
    assert not env.exists()


def test_site_add_and_rename(rastro, env: Path):
    assert rastro("site", "add", "s1") == (0, "site s1 added\n", "")
    assert rastro("site", "add", "s1", "--name", "Shop") == (0, "site s1 updated\n", "")
    assert stored(env, "SELECT site_id, name FROM sites") == [("s1", "Shop")]


def test_a_site_name_may_be_any_script_and_emoji(rastro, env: Path):
    name = "Loja São João ☀️ 👨‍👩‍👧 東京"
    assert rastro("site", "add", "s1", "--name", f" {name} ") == (0, "site s1 added\n", "")
    assert stored(env, "SELECT name FROM sites") == [(name,)]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("Shop\x1b[31m red", "control"),
        ("Shop\nsecond line", "control"),
        ("Shop\u2028two", "control"),
        ("Shop \u202egnp.exe", "bidirectional"),
        ("x" * 9000, "9000 characters long"),
    ],
    ids=["escape", "newline", "line-separator", "bidi-override", "9000-chars"],
)
def test_a_site_name_with_control_characters_or_too_long_is_refused(
    rastro, env: Path, name, fragment
):
    assert rastro("site", "add", "s1", "--name", "Shop")[0] == 0
    before = snapshot(env)
    line = assert_usage_error(rastro("site", "add", "s1", "--name", name), fragment)
    assert len(line) < 300
    assert snapshot(env) == before


def test_link_refuses_an_absurd_account_id(rastro, env: Path, world, meta: FakeMeta):
    before = snapshot(env)
    twenty_nine = "1" * 29
    line = assert_usage_error(
        rastro(*explicit_link("s1", twenty_nine, "c1", "UTC", "USD"), "--no-verify"),
        "at most 20 digits",
    )
    assert twenty_nine in line
    assert snapshot(env) == before
    assert meta.calls == []
    assert rastro(*explicit_link("s1", "9" * 17, "c1", "UTC", "USD"), "--no-verify")[0] == 0


def test_a_long_site_id_is_shown_as_given(rastro, env: Path, world):
    """The scrubber redacts token-shaped text only: an id we accept is never one."""
    site = "shop" + "0123456789" * 6
    line = assert_usage_error(
        rastro(*explicit_link(site, "act_5", "c1", "UTC", "USD"), "--no-verify"),
        f"unknown site {site!r}",
    )
    assert "[redacted]" not in line
    assert rastro("site", "add", site)[0] == 0


def test_a_token_shaped_id_is_refused_and_not_echoed(rastro, env: Path):
    before = snapshot(env)
    line = assert_usage_error(rastro("site", "add", NEW_TOKEN), "looks like a Meta access token")
    assert "[redacted]" in line
    assert snapshot(env) == before


# connect ------------------------------------------------------------------------


def test_connect_seals_the_token_from_stdin(rastro, env: Path, secrets_key: str):
    code, out, err = rastro("connect", "c1", "--no-verify", stdin=f"  {TOKEN}\n\n")
    assert (code, out, err) == (0, "connection c1 saved\n", "")
    [(status, sealed)] = stored(env, "SELECT status, sealed_token FROM meta_connections")
    assert status == "active"
    assert Vault.from_env().open("c1", sealed) == TOKEN
    for file in env.parent.iterdir():
        assert TOKEN.encode() not in file.read_bytes()


def test_connect_reads_a_named_variable(rastro, env: Path, monkeypatch):
    monkeypatch.setenv("META_TOKEN", TOKEN)
    assert rastro("connect", "c1", "--no-verify", "--token-env", "META_TOKEN")[0] == 0
    [(sealed,)] = stored(env, "SELECT sealed_token FROM meta_connections")
    assert Vault.from_env().open("c1", sealed) == TOKEN


def test_connect_verifies_with_meta(rastro, env: Path, meta: FakeMeta):
    assert rastro("connect", "c1", stdin=TOKEN)[0] == 0
    assert meta.calls == [("check_token", TOKEN), ("close",)]


def test_connect_refused_by_meta_writes_nothing(rastro, env: Path, meta: FakeMeta):
    rastro("site", "add", "s1")
    before = snapshot(env)
    meta.refuse = MetaError(ErrorKind.TOKEN, f"Invalid OAuth access token {TOKEN}", code=190)
    result = rastro("connect", "c1", stdin=TOKEN)
    assert_usage_error(result, "Meta refused the token", "code 190", "[redacted]")
    assert snapshot(env) == before


def test_connect_when_meta_is_down_suggests_no_verify(rastro, env: Path, meta: FakeMeta):
    meta.refuse = MetaError(ErrorKind.TRANSIENT, "connection reset")
    assert_usage_error(rastro("connect", "c1", stdin=TOKEN), "--no-verify")


def test_a_new_token_revives_a_paused_connection(rastro, env: Path, world, now):
    rastro("link", "s1", "act_5", "--connection", "c1", "--timezone", "UTC", "--currency", "USD")
    with Warehouse(env).connect() as con:
        sealed_at = registry.get_connection(con, "c1").sealed_at
        registry.mark_connection_invalid(
            con, "c1", "META_TOKEN_INVALID: x", now, token_sealed_at=sealed_at
        )
    code, out, _ = rastro("connect", "c1", "--no-verify", stdin=NEW_TOKEN)
    assert code == 0
    assert out == "connection c1: token replaced; 1 paused account resumes\n"
    [(status, invalid_since, sealed)] = stored(
        env, "SELECT status, invalid_since, sealed_token FROM meta_connections"
    )
    assert (status, invalid_since) == ("active", None)
    assert Vault.from_env().open("c1", sealed) == NEW_TOKEN


def test_status_forgets_the_dead_tokens_error_once_a_new_token_is_sealed(
    rastro, env: Path, world, now
):
    """The sync that failed started before the new token; the next one uses the new token."""
    rastro(*explicit_link("s1", "act_5", "c1", "UTC", "USD"))
    failed_at = now - timedelta(minutes=10)
    with Warehouse(env).connect() as con:
        sealed_at = registry.get_connection(con, "c1").sealed_at
        record_sync_run(
            con,
            "r1",
            "act_5",
            "live",
            failed_at.date(),
            failed_at.date(),
            failed_at,
            outcome="token",
            error="META_TOKEN_INVALID: Session has expired",
            token_sealed_at=sealed_at,
        )
        registry.mark_connection_invalid(
            con,
            "c1",
            "META_TOKEN_INVALID: Session has expired",
            failed_at,
            token_sealed_at=sealed_at,
        )
    [paused] = json.loads(rastro("status", "--json")[1])
    assert (paused["state"], paused["last_error"][:19]) == ("paused", "META_TOKEN_INVALID:")

    assert rastro("connect", "c1", "--no-verify", stdin=NEW_TOKEN)[0] == 0
    [resumed] = json.loads(rastro("status", "--json")[1])
    assert (resumed["state"], resumed["last_error"]) == ("backfilling", None)


@pytest.mark.parametrize(
    ("args", "stdin", "fragments"),
    [
        (("connect", "c1", "--no-verify"), "", ("no token on stdin",)),
        (("connect", "c1", "--no-verify"), "  \n", ("no token on stdin",)),
        (("connect", "c1", "--no-verify"), f"{TOKEN} extra", ("spaces",)),
        (("connect", "c1", "--no-verify"), f"{TOKEN}\n{TOKEN}", ("line breaks",)),
        (("connect", "c1", "--no-verify", "--token-env", "NOPE"), "", ("NOPE is not set",)),
        (("connect", "bad id", "--no-verify"), TOKEN, ("connection id 'bad id'",)),
        (("connect", "--no-verify"), TOKEN, ("CONNECTION_ID",)),
        (("connect", "c1", TOKEN), "", ("unrecognized arguments", "[redacted]")),
    ],
)
def test_bad_connect_inputs(rastro, env: Path, world, args, stdin, fragments):
    before = snapshot(env)
    result = rastro(*args, stdin=stdin)
    assert_usage_error(result, *fragments)
    assert snapshot(env) == before


# Distinctive, so that any four characters of one in an error line would show.
SHAPED = "EAAQ7vX9kLm2Zp4RwTy8Nc3Hd6Jf1Gs5Bq0"


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
@pytest.mark.parametrize(
    ("token", "fragment"),
    [
        (SHAPED[:12] + "é" + SHAPED[12:], "outside printable ASCII"),
        (SHAPED[:12] + "\u200b" + SHAPED[12:], "outside printable ASCII"),
        (SHAPED[:12] + "\u00a0" + SHAPED[12:], "spaces"),
        (SHAPED[:12] + "\t" + SHAPED[12:], "spaces"),
        (SHAPED[:10], "10 characters long"),
        (SHAPED * 120, "4200 characters long"),
    ],
    ids=["accent", "zero-width", "nbsp", "tab", "short", "long"],
)
def test_a_token_not_shaped_like_metas_is_refused_before_sealing(
    rastro, env: Path, world, monkeypatch, fake_graph, token, verify, fragment
):
    """Real HTTP to the fake Graph when verifying: httpx once named the bad character."""
    monkeypatch.setenv("RASTRO_META_GRAPH_URL", fake_graph.base_url)
    requests = fake_graph.world.record_requests()
    before = snapshot(env)
    args = ("connect", "c2") if verify else ("connect", "c2", "--no-verify")
    line = assert_usage_error(rastro(*args, stdin=token), fragment)
    assert snapshot(env) == before
    assert requests == []
    assert "position" not in line
    odd = {char for char in token if not ("!" <= char <= "~")}
    assert not odd & set(line), line
    assert not any(token[i : i + 4] in line for i in range(len(token) - 3)), line


def test_connect_without_a_key_fails_closed(rastro, env: Path, monkeypatch):
    monkeypatch.delenv(ENV_VAR)
    assert_usage_error(rastro("connect", "c1", "--no-verify", stdin=TOKEN), f"{ENV_VAR} is not set")
    assert not env.exists()


def test_connect_with_a_short_key_fails_closed(rastro, env: Path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, base64.b64encode(b"short").decode())
    assert_usage_error(rastro("connect", "c1", "--no-verify", stdin=TOKEN), ENV_VAR, "5 bytes")
    assert not env.exists()


# link and unlink ----------------------------------------------------------------


def explicit_link(site: str, account: str, connection: str, tz: str, currency: str) -> tuple:
    return (
        "link",
        site,
        account,
        "--connection",
        connection,
        "--timezone",
        tz,
        "--currency",
        currency,
    )


LINK = explicit_link("s1", "act_5", "c1", "UTC", "usd")


@pytest.mark.engines("duckdb", "postgres")
def test_link_with_explicit_timezone_and_currency(
    rastro, env: Path, warehouse, world, meta: FakeMeta
):
    code, out, err = rastro(*LINK)
    assert (code, err) == (0, "")
    assert out == "linked s1 to act_5 (UTC, USD) via c1\n"
    assert stored(
        warehouse, "SELECT ad_account_id, connection_id, timezone, currency FROM meta_ad_accounts"
    ) == [("act_5", "c1", "UTC", "USD")]
    assert stored(warehouse, "SELECT site_id, ad_account_id FROM site_ad_accounts") == [
        ("s1", "act_5")
    ]
    assert meta.calls == []


def test_link_fills_each_shard_to_its_size_then_warns(rastro, env: Path, world, meta: FakeMeta):
    sized = {"RASTRO_ACCOUNT_SHARDS": "2", "RASTRO_SHARD_ACCOUNTS": "1"}
    for account in ("act_5", "act_6"):
        code, _, err = rastro(*explicit_link("s1", account, "c1", "UTC", "usd"), environ=sized)
        assert (code, err) == (0, "")
    code, _, err = rastro(*explicit_link("s1", "act_7", "c1", "UTC", "usd"), environ=sized)
    assert code == 0
    assert "ad_spend_daily holds 2 accounts, more than the 1 (RASTRO_SHARD_ACCOUNTS)" in err
    assert "set RASTRO_ACCOUNT_SHARDS=3 (now 2)" in err
    assert stored(env, "SELECT ad_account_id, shard FROM ad_account_shards ORDER BY 1") == [
        ("act_5", 0), ("act_6", 1), ("act_7", 0)
    ]


def test_relink_is_a_no_op_that_succeeds(rastro, env: Path, world, meta: FakeMeta):
    rastro(*LINK)
    before = snapshot(env)
    code, out, err = rastro("link", "s1", "5", "--connection", "c1")
    assert (code, err) == (0, "")
    assert "already linked" in out
    assert snapshot(env) == before
    assert meta.calls == []


def test_link_reads_timezone_and_currency_from_meta(rastro, env: Path, world, meta: FakeMeta):
    code, out, _ = rastro("link", "s1", "77", "--connection", "c1")
    assert code == 0
    assert "(America/Sao_Paulo, BRL)" in out
    assert stored(env, "SELECT timezone, currency, name FROM meta_ad_accounts") == [
        ("America/Sao_Paulo", "BRL", "Shop")
    ]
    assert meta.calls == [("account", TOKEN, "act_77"), ("close",)]


def test_link_keeps_an_explicit_value_over_meta(rastro, env: Path, world, meta: FakeMeta):
    assert rastro("link", "s1", "77", "--connection", "c1", "--currency", "EUR")[0] == 0
    assert stored(env, "SELECT timezone, currency FROM meta_ad_accounts") == [
        ("America/Sao_Paulo", "EUR")
    ]


def test_link_refused_when_synced_through_another_connection(rastro, env: Path, world):
    rastro(*LINK)
    rastro("site", "add", "s2")
    rastro("connect", "c2", "--no-verify", stdin=NEW_TOKEN)
    before = snapshot(env)
    result = rastro(*explicit_link("s2", "act_5", "c2", "UTC", "USD"))
    assert_usage_error(result, "already synced through connection 'c1'")
    assert snapshot(env) == before


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (explicit_link("s1", "act_5|2026-11-30", "c1", "UTC", "USD"), ("act_<digits>",)),
        (("link", "s1", "act_", "--connection", "c1"), ("act_<digits>",)),
        (explicit_link("s1", "act_5", "c1", "Mars/Base", "USD"), ("IANA",)),
        (explicit_link("s1", "act_5", "c1", "UTC", "dollars"), ("three-letter",)),
        (explicit_link("nope", "act_5", "c1", "UTC", "USD"), ("unknown site 'nope'",)),
        (explicit_link("s1", "act_5", "c9", "UTC", "USD"), ("unknown connection 'c9'",)),
        (("link", "s1", "act_5", "--connection", "c1", "--no-verify"), ("--timezone and",)),
        (("link", "s1", "act_5", "--timezone", "UTC", "--currency", "USD"), ("--connection",)),
        (("link", "s1", "act_404", "--connection", "c1"), ("Meta could not read act_404",)),
    ],
)
def test_bad_link_inputs(rastro, env: Path, world, meta: FakeMeta, args, fragments):
    before = snapshot(env)
    assert_usage_error(rastro(*args), *fragments)
    assert snapshot(env) == before


def test_link_with_meta_answering_nonsense(rastro, env: Path, world, meta: FakeMeta):
    meta.accounts["act_8"] = AdAccount("act_8", None, "USD", "Not/AZone")
    before = snapshot(env)
    assert_usage_error(rastro("link", "s1", "8", "--connection", "c1"), "IANA")
    assert snapshot(env) == before


def test_link_with_the_wrong_key_fails_closed(rastro, env: Path, world, monkeypatch, meta):
    monkeypatch.setenv(ENV_VAR, base64.b64encode(b"k" * 32).decode())
    before = snapshot(env)
    assert_usage_error(
        rastro("link", "s1", "77", "--connection", "c1"), f"{ENV_VAR} does not open this token"
    )
    assert snapshot(env) == before
    assert meta.calls == []


def test_link_registers_the_dagster_partition(rastro, env: Path, world, monkeypatch, tmp_path):
    import dagster as dg

    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    code, _, err = rastro(*LINK)
    assert (code, err) == (0, "")
    with dg.DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions("meta_ad_account") == ["act_5"]
    assert rastro("link", "s1", "act_5", "--connection", "c1")[0] == 0
    with dg.DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions("meta_ad_account") == ["act_5"]


@pytest.mark.engines("duckdb", "postgres")
def test_unlink(rastro, env: Path, warehouse, world):
    rastro(*LINK)
    rastro("site", "add", "s2")
    rastro("link", "s2", "act_5", "--connection", "c1")
    assert rastro("unlink", "s1", "act_5") == (0, "unlinked s1 from act_5\n", "")
    code, out, _ = rastro("unlink", "s2", "5")
    assert code == 0
    assert "were removed" in out
    assert stored(warehouse, "SELECT count(*) FROM meta_ad_accounts") == [(0,)]
    assert stored(warehouse, "SELECT count(*) FROM site_ad_accounts") == [(0,)]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("unlink", "s1", "act_6"), ("not linked to act_6",)),
        (("unlink", "s1", "act_x"), ("act_<digits>",)),
        (("unlink", "s1"), ("AD_ACCOUNT_ID",)),
    ],
)
def test_bad_unlink_inputs(rastro, env: Path, world, args, fragments):
    rastro(*LINK)
    before = snapshot(env)
    assert_usage_error(rastro(*args), *fragments)
    assert snapshot(env) == before


# the parser and the process ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "COMMAND"),
        (("frobnicate",), "invalid choice"),
        (("site",), "ACTION"),
        (("site", "delete", "s1"), "invalid choice"),
        (("site", "add"), "SITE_ID"),
        (("site", "rename", "s1"), "NAME"),
        (("site", "list", "s1"), "unrecognized arguments"),
        (("shard", "spread"), "invalid choice"),
        (("shard", "list", "--all"), "unrecognized arguments"),
        (("keygen", "--bits", "128"), "unrecognized arguments"),
    ],
)
def test_argparse_errors_are_one_line(rastro, env: Path, args, fragment):
    assert_usage_error(rastro(*args), fragment)
    assert not env.exists()


def test_help_exits_zero(rastro, capsys: pytest.CaptureFixture[str]):
    code, _, _ = rastro("--help")
    out = capsys.readouterr().out
    assert code == 0
    for name in ("keygen", "site", "connect", "link", "unlink"):
        assert name in out


def test_a_locked_warehouse_is_one_line(rastro, env: Path, world, monkeypatch):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(env)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(
            engines,
            "Warehouse",
            lambda path, **named: Warehouse(path, lock_wait_seconds=0.2, **named),
        )
        assert_usage_error(
            rastro("site", "add", "s9"), "locked by another process", f"PID {holder.pid}"
        )
    finally:
        holder.kill()
        holder.wait()


def test_the_console_script(env: Path, tmp_path: Path):
    script = Path(sys.executable).with_name("rastro")
    assert script.exists(), "install the package first: pip install -e ."
    run_env = {**os.environ, "RASTRO_DUCKDB_PATH": str(env)}
    run_env.pop("DAGSTER_HOME", None)

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=run_env,
            timeout=60,
        )

    assert run("site", "add", "s1").returncode == 0
    connected = run("connect", "c1", "--no-verify", stdin=TOKEN + "\n")
    assert connected.returncode == 0, connected.stderr
    linked = run(*LINK)
    assert (linked.returncode, linked.stdout) == (0, "linked s1 to act_5 (UTC, USD) via c1\n")
    refused = run("link", "s1", "act_5|x", "--connection", "c1")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("rastro: error: ")
    assert refused.stdout == ""
    for result in (connected, linked, refused):
        assert TOKEN not in result.stdout + result.stderr


def test_against_the_fake_graph(rastro, env: Path, monkeypatch):
    from rastro_fake_graph import DEMO_TOKEN

    monkeypatch.setenv("RASTRO_META_FAKE", "true")
    rastro("site", "add", "s1")
    refused = rastro("connect", "c1", stdin="EAAnotTheDemoToken")
    assert_usage_error(refused, "Meta refused the token")
    code, out, err = rastro("connect", "c1", stdin=DEMO_TOKEN)
    assert (code, out, err) == (0, "connection c1 saved\n", "")
    code, out, err = rastro("link", "s1", "1001", "--connection", "c1")
    assert (code, err) == (0, "")
    assert "(America/Sao_Paulo, BRL)" in out
    for result in (refused, (code, out, err)):
        assert DEMO_TOKEN not in result[1] + result[2]
