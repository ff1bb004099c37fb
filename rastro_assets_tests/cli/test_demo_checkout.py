"""`rastro` inside the demo's checkout: with nothing exported, `connect`, `accounts` and
`link` take the demo's key (the one its daemon has) and the demo's fake Graph (the running
demo's server, else the demo world in-process), saying so in one line; elsewhere, or with a
variable set, neither. A key error says what fixes it. `publish` publishes the analytics
snapshot without Dagster's warnings."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path

import pytest

from rastro_assets import demo
from rastro_assets.cli.context import Context
from rastro_assets.demo.graph import DemoGraph, read_graph_file, write_graph_file
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.meta.client import MetaClient
from rastro_assets.process_settings import DEFAULT_GRAPH_URL
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import Rastro, assert_usage_error
from rastro_fake_graph import DEMO_TOKEN, FakeGraphTransport, FakeWorld, serve
from rastro_fake_graph.world import DEMO_UNLINKED

REPO = Path(__file__).resolve().parents[2]
TOKEN = "EAAB0demoCheckoutToken0123456789abcdef"
IN_PROCESS_NOTE = (
    "rastro: note: in the demo's folder with nothing exported: the demo's key data/secrets.key"
    " and the demo's fake Meta Graph, in this process (data/fake-graph.json names no running"
    " demo's)\n"
)
UNLINKED = sorted(DEMO_UNLINKED)
REAL_GRAPH = DEFAULT_GRAPH_URL


@pytest.fixture
def rastro_environ() -> Mapping[str, str]:
    """No variable names a file or a key: the files are found from the working directory."""
    return {}


@pytest.fixture
def never_printed() -> list[str]:
    return [TOKEN]


@pytest.fixture
def daemon_env(checkout: DemoPaths, now: datetime) -> dict[str, str]:
    """The environment `rastro demo` starts Dagster with, when RASTRO_SECRETS_KEY is unset."""
    return demo.prepare(checkout, now=now, environ={})


def sealed(paths: DemoPaths, connection_id: str) -> bytes | None:
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        connection = registry.get_connection(con, connection_id)
    return connection.sealed_token if connection else None


def test_connect_in_the_demos_checkout_seals_with_the_key_its_daemon_has(
    rastro: Rastro, checkout: DemoPaths, daemon_env: dict[str, str]
):
    code, out, err = rastro("connect", "mine", "--no-verify", stdin=TOKEN)
    assert (code, out, err) == (0, "connection mine saved\n", IN_PROCESS_NOTE)
    # The daemon opens it with what the demo handed it.
    assert Vault.from_env(daemon_env).open("mine", sealed(checkout, "mine")) == TOKEN


def test_a_key_in_the_environment_wins_over_the_demos_file(
    rastro: Rastro, checkout: DemoPaths
):
    own = generate_key()
    code, out, _ = rastro("connect", "mine", "--no-verify", stdin=TOKEN, environ={ENV_VAR: own})
    assert (code, out) == (0, "connection mine saved\n")
    assert Vault.from_env({ENV_VAR: own}).open("mine", sealed(checkout, "mine")) == TOKEN


@pytest.mark.parametrize("mode", [0o640, 0o644])
def test_a_demo_key_file_others_may_read_is_refused_and_nothing_is_sealed(
    rastro: Rastro, checkout: DemoPaths, mode: int
):
    checkout.key_file.chmod(mode)
    assert_usage_error(
        rastro("connect", "mine", "--no-verify", stdin=TOKEN),
        f"{checkout.key_file} is open to group or others (mode {mode:04o})",
        "chmod 600",
    )
    assert sealed(checkout, "mine") is None


def test_a_symlink_at_the_demos_key_file_is_refused(
    rastro: Rastro, checkout: DemoPaths, tmp_path: Path
):
    theirs = tmp_path / "theirs.key"
    theirs.write_text(generate_key())
    theirs.chmod(0o600)
    checkout.key_file.unlink()
    checkout.key_file.symlink_to(theirs)
    assert_usage_error(
        rastro("connect", "mine", "--no-verify", stdin=TOKEN),
        f"{checkout.key_file} is a symbolic link",
    )
    assert sealed(checkout, "mine") is None


def test_another_warehouse_from_the_checkout_names_the_demo_key_not_taken(
    rastro: Rastro, checkout: DemoPaths, tmp_path: Path
):
    other = tmp_path / "other.duckdb"
    line = assert_usage_error(
        rastro(
            "connect",
            "mine",
            "--no-verify",
            stdin=TOKEN,
            environ={"RASTRO_DUCKDB_PATH": str(other)},
        ),
        f"{ENV_VAR} is not set, and data/secrets.key is the demo's key",
        f"this command's warehouse is {other}",
        f"export {ENV_VAR}",
    )
    assert "rastro keygen" not in line


def test_the_demos_warehouse_from_outside_its_checkout_names_the_key_beside_it(
    rastro: Rastro, checkout: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert_usage_error(
        rastro(
            "connect",
            "mine",
            "--no-verify",
            stdin=TOKEN,
            environ={"RASTRO_DUCKDB_PATH": str(checkout.duckdb)},
        ),
        f"{ENV_VAR} is not set, and {checkout.key_file} is the demo's key",
    )
    assert sealed(checkout, "mine") is None


def test_without_a_demo_key_file_the_variable_is_asked_for(rastro: Rastro, tmp_path: Path):
    assert_usage_error(
        rastro(
            "connect",
            "mine",
            "--no-verify",
            stdin=TOKEN,
            environ={"RASTRO_DUCKDB_PATH": str(tmp_path / "plain.duckdb")},
        ),
        f"{ENV_VAR} is not set: tokens cannot be sealed or opened without it",
        "rastro keygen",
    )


def test_the_vault_says_nothing_when_the_variable_is_set(checkout: DemoPaths):
    key = generate_key()
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(environ={ENV_VAR: key}, stdin=io.StringIO(), stdout=out, stderr=err)
    sealed_token = ctx.vault().seal("c", TOKEN)
    assert Vault.from_env({ENV_VAR: key}).open("c", sealed_token) == TOKEN
    assert (out.getvalue(), err.getvalue()) == ("", "")


# Meta's commands with nothing exported -------------------------------------------


def reached(rastro: Rastro, **kwargs) -> dict[str, list[str]]:
    """`rastro accounts demo --json`: each account the demo's token reaches, and its sites."""
    code, out, err = rastro("accounts", "demo", "--json", **kwargs)
    assert code == 0, err
    return {entry["ad_account_id"]: entry["sites"] for entry in json.loads(out)}


def test_accounts_lists_what_the_demo_did_not_link_with_nothing_exported(
    rastro: Rastro, checkout: DemoPaths
):
    code, out, err = rastro("accounts", "demo")
    assert (code, err) == (0, IN_PROCESS_NOTE)
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert sorted(rows) == ["act_1001", "act_1002", "act_1003", *UNLINKED]
    assert rows["act_1002"].rstrip().endswith("demo-clinic,demo-shop")
    for act in UNLINKED:
        timezone, currency, _ = DEMO_UNLINKED[act]
        assert rows[act].split()[-4:] == [currency, timezone, "ACTIVE", "-"]


def test_link_all_onboards_the_rest_with_nothing_exported(rastro: Rastro, checkout: DemoPaths):
    code, out, err = rastro("link", "demo-shop", "--all", "--connection", "demo")
    assert (code, err) == (0, IN_PROCESS_NOTE)
    assert out.splitlines() == [
        *(
            f"linked demo-shop to {act} ({DEMO_UNLINKED[act][0]}, {DEMO_UNLINKED[act][1]})"
            " via demo"
            for act in UNLINKED
        ),
        "demo-shop: 5 linked, 0 already linked, 0 refused (via demo)",
    ]
    assert all(sites == ["demo-shop"] for act, sites in reached(rastro).items()
               if act in DEMO_UNLINKED)


def test_link_one_account_reads_it_from_the_demos_fake(rastro: Rastro, checkout: DemoPaths):
    code, out, err = rastro("link", "demo-clinic", "1005", "--connection", "demo")
    assert (code, out, err) == (
        0, "linked demo-clinic to act_1005 (Asia/Kolkata, INR) via demo\n", IN_PROCESS_NOTE
    )


def test_the_readmes_connect_runs_as_written_with_no_exports(checkout: DemoPaths):
    """The demo's token is in the README, and its command works in a shell with no RASTRO_*."""
    [line] = [
        line for line in (REPO / "README.md").read_text().splitlines()
        if ".venv/bin/rastro connect demo" in line
    ]
    assert DEMO_TOKEN in line
    (checkout.root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RASTRO_", "DAGSTER_"))}
    result = subprocess.run(
        ["bash", "-c", line], cwd=checkout.root, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "connection demo: token replaced\n", IN_PROCESS_NOTE
    )
    assert opened(checkout, demo.DEMO_CONNECTION) == DEMO_TOKEN


def test_connect_checks_the_token_with_the_demos_fake(rastro: Rastro, checkout: DemoPaths):
    assert_usage_error(rastro("connect", "demo", stdin=TOKEN), "Meta refused the token")
    assert opened(checkout, demo.DEMO_CONNECTION) == DEMO_TOKEN  # nothing replaced


def opened(paths: DemoPaths, connection_id: str) -> str:
    """The connection's token, opened with the demo's key."""
    vault = Vault.from_env({ENV_VAR: paths.key_file.read_text().strip()})
    return vault.open(connection_id, sealed(paths, connection_id))


@pytest.fixture
def served(checkout: DemoPaths) -> Iterator[FakeWorld]:
    """A running demo's fake Graph, named in data/fake-graph.json as `rastro demo` names it:
    a world holding one account the in-process demo world does not."""
    world = FakeWorld.demo()
    world.add_account("act_1099", timezone="Africa/Nairobi", currency="KES", name="Served only")
    with serve(world) as server:
        write_graph_file(
            checkout.graph_file,
            DemoGraph(server.base_url, f"{server.origin}/control", "k", os.getpid()),
        )
        yield world


def test_the_running_demos_graph_is_asked(rastro: Rastro, checkout: DemoPaths, served):
    url = read_graph_file(checkout.graph_file).url
    code, out, err = rastro("accounts", "demo")
    assert err == (
        "rastro: note: in the demo's folder with nothing exported: the demo's key"
        f" data/secrets.key and the running demo's fake Meta Graph at {url}\n"
    )
    assert "act_1099" in out
    code, out, err = rastro("link", "demo-shop", "act_1099", "--connection", "demo")
    assert (code, out) == (0, "linked demo-shop to act_1099 (Africa/Nairobi, KES) via demo\n")
    served.kill_token(DEMO_TOKEN)
    assert_usage_error(rastro("connect", "demo", stdin=DEMO_TOKEN), "Meta refused the token")


@pytest.mark.parametrize("variable", ["RASTRO_META_GRAPH_URL", "RASTRO_META_FAKE"])
def test_a_graph_variable_set_takes_nothing_of_the_demos(
    rastro: Rastro, checkout: DemoPaths, served, variable: str
):
    value = "http://127.0.0.1:9/v25.0" if variable == "RASTRO_META_GRAPH_URL" else "false"
    ctx = context({variable: value})
    assert ctx.demo_folder() is None
    with ctx.meta_client(DEMO_TOKEN) as client:
        assert asks(client) == (value if value.startswith("http") else REAL_GRAPH)
    assert_usage_error(
        rastro("accounts", "demo", environ={variable: value}),
        f"{ENV_VAR} is not set, and the demo's key data/secrets.key is taken in the demo's"
        f" folder only with nothing exported: `unset {variable}`",
    )
    assert "act_1099" in reached(rastro)  # as it says: unset, the running demo's Graph


@pytest.mark.parametrize(
    "environ", [{ENV_VAR: "own"}, {"RASTRO_WAREHOUSE_URL": "postgresql://u@h/d"}],
    ids=["key", "warehouse"],
)
def test_a_key_or_another_warehouse_set_takes_nothing_of_the_demos(
    checkout: DemoPaths, served, environ: dict[str, str]
):
    environ = {**environ, ENV_VAR: generate_key()} if ENV_VAR in environ else environ
    ctx = context(environ)
    assert ctx.demo_folder() is None
    with ctx.meta_client(DEMO_TOKEN) as client:
        assert asks(client) == REAL_GRAPH
    ctx.release_note()
    assert ctx.stderr.getvalue() == ""


def test_from_another_folder_the_demo_takes_nothing_of_the_demos(
    checkout: DemoPaths, served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ctx = context({"RASTRO_DUCKDB_PATH": str(checkout.duckdb)})
    assert ctx.demo_folder() is None
    with ctx.meta_client(DEMO_TOKEN) as client:
        assert asks(client) == REAL_GRAPH
    with pytest.raises(SecretsKeyError, match=f"^{ENV_VAR} is not set, and .* is the demo's key"):
        ctx.vault()
    ctx.release_note()
    assert ctx.stderr.getvalue() == ""


def asks(client: MetaClient) -> str:
    """Where the client's requests go: the demo world in this process, or a base URL."""
    if isinstance(client._session.http._transport, FakeGraphTransport):
        return "the in-process fake"
    return client._session.base_url


def context(environ: dict[str, str]) -> Context:
    return Context(environ=environ, stdin=io.StringIO(), stdout=io.StringIO(),
                   stderr=io.StringIO())


# Key errors say what fixes them --------------------------------------------------


def test_a_fresh_key_exported_in_the_demos_folder_is_told_to_go(
    rastro: Rastro, checkout: DemoPaths
):
    # What the user did: `rastro keygen`, exported, and the old RASTRO_META_FAKE advice.
    environ = {ENV_VAR: generate_key(), "RASTRO_META_FAKE": "true"}
    assert_usage_error(
        rastro("accounts", "demo", environ=environ),
        f"{ENV_VAR} does not open this token (connection 'demo'): it is sealed with the demo's"
        " key data/secrets.key, which the demo's folder takes when nothing is exported:"
        f" `unset {ENV_VAR} RASTRO_META_FAKE`",
    )
    assert UNLINKED[0] in reached(rastro)  # and with them unset, it works


def test_a_token_the_demos_key_does_not_open_is_sealed_again_here(
    rastro: Rastro, checkout: DemoPaths, now: datetime
):
    demo.prepare(checkout, now=now, environ={ENV_VAR: generate_key()})  # a demo on its own key
    assert_usage_error(
        rastro("link", "demo-shop", "--all", "--connection", "demo"),
        "data/secrets.key, the demo's key, does not open the token of connection 'demo'",
        "seal it again here with nothing exported: `rastro connect demo`; or restart"
        " `rastro demo` with nothing exported",
    )
    code, _, _ = rastro("connect", "demo", stdin=DEMO_TOKEN)
    assert code == 0
    assert UNLINKED[0] in reached(rastro)


def test_elsewhere_a_wrong_key_is_told_to_take_the_daemons(rastro: Rastro, tmp_path: Path):
    daemons = generate_key()
    environ = {"RASTRO_DUCKDB_PATH": str(tmp_path / "w.duckdb"), "RASTRO_META_FAKE": "true"}
    assert rastro("site", "add", "s1", environ=environ)[0] == 0
    assert rastro("connect", "c1", stdin=DEMO_TOKEN, environ={**environ, ENV_VAR: daemons})[0] == 0
    line = assert_usage_error(
        rastro("link", "s1", "1001", "--connection", "c1", environ={**environ,
                                                                     ENV_VAR: generate_key()}),
        f"{ENV_VAR} does not open this token (connection 'c1'): export the key the daemon of"
        " this warehouse runs with, the one the token was sealed with",
    )
    assert "demo" not in line
    code, out, _ = rastro("link", "s1", "1001", "--connection", "c1",
                          environ={**environ, ENV_VAR: daemons})
    assert (code, out) == (0, "linked s1 to act_1001 (America/Sao_Paulo, BRL) via c1\n")


def test_elsewhere_a_missing_key_is_told_to_be_the_daemons(rastro: Rastro, tmp_path: Path):
    assert_usage_error(
        rastro("accounts", "c1", environ={"RASTRO_DUCKDB_PATH": str(tmp_path / "w.duckdb")}),
        "unknown connection",
    )
    environ = {"RASTRO_DUCKDB_PATH": str(tmp_path / "w.duckdb"), "RASTRO_META_FAKE": "true"}
    rastro("connect", "c1", stdin=DEMO_TOKEN, environ={**environ, ENV_VAR: generate_key()})
    assert_usage_error(
        rastro("accounts", "c1", environ=environ),
        f"{ENV_VAR} is not set: tokens cannot be sealed or opened without it; set it to the key"
        " this warehouse's tokens are sealed with, the one its daemon runs with",
    )


# publish --------------------------------------------------------------------------


def test_publish_writes_the_snapshot_now(rastro: Rastro, checkout: DemoPaths):
    snapshot = checkout.data / "analytics.duckdb"
    assert not snapshot.exists()
    code, out, err = rastro("publish")
    assert (code, err) == (0, "")
    assert out.startswith(f"published {snapshot}: ")
    code, out, _ = rastro("sql", "SELECT count(*) AS n FROM sites", "--format", "csv")
    assert (code, out.split()) == (0, ["n", "2"])


def test_publish_without_a_warehouse_writes_nothing(rastro: Rastro, tmp_path: Path):
    missing = tmp_path / "none" / "rastro.duckdb"
    assert_usage_error(
        rastro("publish", environ={"RASTRO_DUCKDB_PATH": str(missing)}), "no warehouse at"
    )
    assert not missing.parent.exists()


def test_publish_prints_no_warning_of_dagsters(checkout: DemoPaths):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RASTRO_", "DAGSTER_"))}
    rastro = Path(sys.executable).parent / "rastro"
    result = subprocess.run(
        [str(rastro), "publish"], cwd=checkout.root, env=env, capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("published ")


def test_rotate_key_in_the_demos_folder_wants_the_new_key_exported(
    rastro: Rastro, checkout: DemoPaths
):
    before = sealed(checkout, demo.DEMO_CONNECTION)
    assert_usage_error(
        rastro("rotate-key", "--old-key-env", "OLD", environ={"OLD": generate_key()}),
        f"{ENV_VAR} is not set: export the new key as {ENV_VAR}",
    )
    assert sealed(checkout, demo.DEMO_CONNECTION) == before


def context_in(environ: Mapping[str, str]) -> Context:
    return Context(environ, io.StringIO(), io.StringIO(), io.StringIO())


def test_the_check_in_the_demos_folder_takes_its_daemons_home_and_thresholds(
    checkout: DemoPaths, daemon_env: dict[str, str]
):
    environment = context_in({}).environment()
    assert environment["DAGSTER_HOME"] == daemon_env["DAGSTER_HOME"]
    assert environment["RASTRO_ALERT_RATE_LIMITED_MINUTES"] == "1"
    assert daemon_env["RASTRO_ALERT_RATE_LIMITED_MINUTES"] == "1"
    # What the operator sets wins, in the demo's Dagster and in the command alike.
    own = {"RASTRO_ALERT_RATE_LIMITED_MINUTES": "30", "DAGSTER_HOME": "/elsewhere"}
    assert context_in(own).environment() == own
    assert demo.prepare(checkout, environ=own)["RASTRO_ALERT_RATE_LIMITED_MINUTES"] == "30"


def test_below_the_demos_root_its_home_is_not_taken(
    checkout: DemoPaths, monkeypatch: pytest.MonkeyPatch
):
    # The home's dagster.yaml names its storage relative to the root: from below it, a check
    # would read (and create) another storage.
    below = checkout.root / "notebooks"
    below.mkdir()
    monkeypatch.chdir(below)
    environment = context_in({}).environment()
    assert "DAGSTER_HOME" not in environment
    assert environment["RASTRO_ALERT_RATE_LIMITED_MINUTES"] == "1"


def test_outside_the_demos_folder_nothing_of_its_settings_is_taken(
    checkout: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    assert context_in({ENV_VAR: generate_key()}).environment().get("DAGSTER_HOME") is None
    monkeypatch.chdir(tmp_path)
    assert context_in({}).environment() == {}
