"""`rastro demo`: the whole product on the fake Graph, from an empty `data/`.

Idempotent: the first start creates a demo-only secrets key, the warehouse,
two sites and three linked accounts of the fake Graph; later starts reuse
them. Then it starts `dagster dev` (UI and daemon) on the repo's instance,
with a persistent Dagster home in `data/dagster_home`, and stays beside it to
say what Dagster's log does not: what it linked, where the UI is, how far the
first backfills are, and when the analytics snapshot holds them ("ready").
Its own lines start with `rastro demo:`. Of Dagster's output it passes on the
warnings and errors only (`--log-level`, when given after `--`, sets how much):
a run worker prints every event of its run at DEBUG whatever the flag says,
and the UI keeps every run's whole log anyway.

It reads the warehouse only briefly and read-only, and gives up a look at once
when the pipeline's writers hold the file: the demo must never slow them.

A `RASTRO_SECRETS_KEY` already in the environment wins over the demo key in
`data/secrets.key`: whoever keeps real connections in the same warehouse
keeps them readable. The demo connection is re-sealed whenever the key in use
does not open it. `rastro` commands run inside the demo's checkout on its
warehouse take the same key file, and the demo's fake Graph, when nothing is exported
(`demo_folder_paths`, and the CLI's `Context.demo_folder`).

Here: the demo's data and its start. Beside it: where its files are (`paths`), which of
Dagster's lines it passes on (`dagster_output`), its terminal (`terminal`), what it says
while Dagster runs (`watch`), Dagster as its child process (`dagster_process`), and the fake
Graph it serves its processes from a thread, where `rastro demo trouble` stages trouble
(`graph_server`, `trouble`).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path

from rastro_assets.demo import graph_server
from rastro_assets.demo.dagster_output import DagsterOutput, dagster_log_level, quiet_warnings
from rastro_assets.demo.dagster_process import supervise
from rastro_assets.demo.paths import KEY_FILE_NAME, DemoPaths
from rastro_assets.demo.terminal import say
from rastro_assets.demo.watch import Watcher
from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.planner.coverage import backfill_first_day
from rastro_assets.process_settings import Settings
from rastro_assets.settings import (
    DAGSTER_HOME,
    RASTRO_ALERT_RATE_LIMITED_MINUTES,
    RASTRO_ANALYTICS_LAG_SECONDS,
    RASTRO_DUCKDB_PATH,
    RASTRO_META_FAKE,
    RASTRO_PARTITIONS_START,
    RASTRO_SECRETS_KEY,
    environment,
    project_root,
)
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault, generate_key, read_key_file
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Connection, Warehouse
from rastro_fake_graph.world import DEMO_TOKEN, FakeWorld

DEMO_CONNECTION = "demo"
AXIS_SETTING = RASTRO_PARTITIONS_START.name
DEMO_SITES = {"demo-shop": "Demo shop", "demo-clinic": "Demo clinic"}
DEMO_LINKS = {"demo-shop": ("act_1001", "act_1002"), "demo-clinic": ("act_1002", "act_1003")}
# Dagster's planned events as one per asset and run instead of one per account-day: the
# backfill daemon submits a backfill's runs several times faster, and the partitions grid
# no longer marks a running or failed backfill run's days (docs/running.md, "Planned
# events"). Dagster reads it in the process that creates a run (daemon, webserver); an
# operator's own value wins.
PLANNED_SUBSET_VARIABLE = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
# A throttle is told after a minute, not the two hours an operator waits out at Meta: in the
# demo a throttle is one staged to rehearse its alert (`rastro demo trouble throttle`).
DEMO_ALERT_SETTINGS = {RASTRO_ALERT_RATE_LIMITED_MINUTES.name: "1"}
# Where the UI goes unless told: Dagster's own default.
DEFAULT_UI_PORT = 3000
# Run when the demo is stopped, before Dagster is: the runs in flight end canceled by the user.
STOP_RUNS = [sys.executable, "-m", "rastro_assets.instance.runs_in_flight"]


def demo_key_file(duckdb_path: str | os.PathLike[str], cwd: Path | None = None) -> Path | None:
    """The demo's key file when `duckdb_path` is the demo's warehouse seen from `cwd` (the
    checkout's `data/rastro.duckdb`, with `data/secrets.key` beside it); else None.

    What `rastro demo` hands its daemon when RASTRO_SECRETS_KEY is unset, so a token a
    command seals with it there is one the demo's daemon opens.
    """
    paths = demo_folder_paths(duckdb_path, cwd)
    return paths.key_file if paths is not None else None


def demo_folder_paths(
    duckdb_path: str | os.PathLike[str], cwd: Path | None = None
) -> DemoPaths | None:
    """The demo's files when `duckdb_path` is its warehouse seen from `cwd` and its key file
    is there (`demo_key_file`); else None."""
    root = project_root(cwd)
    if root is None or not (root / "dagster.yaml").exists():
        return None
    paths = DemoPaths(root)
    if not os.path.lexists(paths.key_file):
        return None
    if os.path.realpath(duckdb_path) != os.path.realpath(paths.duckdb):
        return None
    return paths


def stray_key_files(duckdb_path: str | os.PathLike[str], cwd: Path | None = None) -> list[Path]:
    """Demo key files a command might have meant, that `demo_key_file` does not take: the
    one beside `duckdb_path`, and the one of the checkout around `cwd`."""
    found = [Path(os.path.abspath(duckdb_path)).parent / KEY_FILE_NAME]
    root = project_root(cwd)
    if root is not None:
        found.append(DemoPaths(root).key_file)
    return [path for path in dict.fromkeys(found) if os.path.lexists(path)]


def demo_key(paths: DemoPaths) -> str:
    """The demo's secrets key, made once and kept in data/ (demo only), readable by its owner."""
    # Private from its creation: it holds the key, the warehouse and Dagster's home.
    paths.data.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not os.path.lexists(paths.key_file):
        # Created with its final mode: the key is never readable by others, not even briefly.
        fd = os.open(paths.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(generate_key() + "\n")
    # Refused unless private and the user's own, as every command that reads it does.
    return read_key_file(paths.key_file)


def prepare(
    paths: DemoPaths, now: datetime | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Create or reuse the demo data; return the environment Dagster runs with."""
    now = now or datetime.now(UTC)
    environ = environment(environ)
    key = RASTRO_SECRETS_KEY.read(environ) or demo_key(paths)
    vault = Vault.from_env({ENV_VAR: key})
    world = FakeWorld.demo()
    warehouse = Warehouse(paths.duckdb)
    with warehouse.connect() as con:
        for site_id, name in DEMO_SITES.items():
            if not site_store.site_exists(con, site_id):
                site_store.add_site(con, site_id, name, now)
        if not _demo_token_stored(con, vault):
            registry.save_connection(
                con, DEMO_CONNECTION, vault.seal(DEMO_CONNECTION, DEMO_TOKEN), now
            )
        for site_id, accounts in DEMO_LINKS.items():
            for ad_account_id in accounts:
                account = world.accounts[ad_account_id]
                link_store.link_account(
                    con,
                    site_id,
                    ad_account_id,
                    DEMO_CONNECTION,
                    account.timezone,
                    account.currency,
                    now,
                    name=account.name,
                )
        axis_start = first_owed_day(registry.linked_accounts(con), now)
    paths.dagster_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # A clone's data/ (it is tracked) or an earlier demo's home may be open to others:
    # they hold the warehouse, and every account's run logs and spend events.
    for directory in (paths.data, paths.dagster_home):
        os.chmod(directory, 0o700)
    # The repo's instance config, refreshed on every start; its relative paths
    # (data/dagster_home/...) resolve from the repo root, where Dagster runs.
    shutil.copyfile(paths.root / "dagster.yaml", paths.dagster_home / "dagster.yaml")
    os.chmod(paths.dagster_home / "dagster.yaml", 0o600)
    return {
        ENV_VAR: key,
        RASTRO_META_FAKE.name: "true",
        RASTRO_DUCKDB_PATH.name: str(paths.duckdb),
        DAGSTER_HOME.name: str(paths.dagster_home),
        # Someone trying the demo waits for their first query: publish within a minute.
        RASTRO_ANALYTICS_LAG_SECONDS.name: RASTRO_ANALYTICS_LAG_SECONDS.raw(environ) or "60",
        # The grid starts where the demo's accounts are first owed: the default axis start
        # would show the days before as "missing" partitions no account is ever owed.
        AXIS_SETTING: environ.get(AXIS_SETTING) or axis_start.isoformat(),
        PLANNED_SUBSET_VARIABLE: environ.get(PLANNED_SUBSET_VARIABLE) or "true",
        **{name: environ.get(name) or value for name, value in DEMO_ALERT_SETTINGS.items()},
    }


def folder_settings(paths: DemoPaths, cwd: Path | None = None) -> dict[str, str]:
    """What the demo's Dagster runs with that a command in its folder takes when unset, to
    agree with it: its alert thresholds, and from the repo root its Dagster home (`rastro
    status --check`): the home's dagster.yaml names its storage relative to the root."""
    at_root = (Path.cwd() if cwd is None else cwd).resolve() == paths.root.resolve()
    home = {"DAGSTER_HOME": str(paths.dagster_home)} if at_root else {}
    return {**home, **DEMO_ALERT_SETTINGS}


def first_owed_day(accounts: list[registry.LinkedAccount], now: datetime) -> date:
    """The first local day any of `accounts` is owed: its backfill's first, from its link."""
    return min(
        (
            backfill_first_day(local_date(account.created_at or now, account.timezone))
            for account in accounts
        ),
        default=backfill_first_day(now.date()),
    )


def _demo_token_stored(con: Connection, vault: Vault) -> bool:
    """Whether the demo connection is active and `vault` opens its token as the demo token."""
    connection = registry.get_connection(con, DEMO_CONNECTION)
    if connection is None or not connection.sealed_token:
        return False
    if connection.status != ConnectionStatus.ACTIVE:
        return False
    try:
        return vault.open(DEMO_CONNECTION, connection.sealed_token) == DEMO_TOKEN
    except SecretsKeyError:
        return False


def linked_lines(paths: DemoPaths) -> list[str]:
    """What the demo linked: its sites, and each account with its timezone, currency, sites."""
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        accounts = registry.linked_accounts(con)
    sites = ", ".join(f"{site} ({name})" for site, name in DEMO_SITES.items())
    lines = [f"sites {sites}; {len(accounts)} fake Meta accounts linked:"]
    lines += [
        f"  {a.ad_account_id} {a.name!r} ({a.timezone}, {a.currency}) -> {', '.join(a.sites)}"
        for a in accounts
    ]
    return lines


def rastro_command(root: Path) -> str:
    """How to call this install's `rastro` from the repo root."""
    rastro = Path(sys.executable).parent / "rastro"
    try:
        return str(rastro.relative_to(root))
    except ValueError:
        return str(rastro)


def run(root: Path, extra_args: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Prepare the demo, then run `dagster dev` and say how the demo is doing until it stops."""
    try:
        return _run(root, extra_args, environ)
    except KeyboardInterrupt:
        # Ctrl-C before Dagster started: each step of the preparation is whole or undone.
        say("stopped")
        return 128 + signal.SIGINT


def _run(root: Path, extra_args: list[str], environ: Mapping[str, str] | None) -> int:
    paths = DemoPaths(root.resolve())
    if not (paths.root / "workspace.yaml").exists():
        print("rastro: error: run `rastro demo` from the repo root", file=sys.stderr)
        return 2
    port = _port(extra_args)
    if port is not None and port_in_use(port):
        print(
            f"rastro: error: port {port} is in use: choose a free one with"
            " `rastro demo --port N`",
            file=sys.stderr,
        )
        return 2
    base = dict(environment(environ))
    env = {**base, **prepare(paths, environ=base)}
    env["PYTHONWARNINGS"] = quiet_warnings(base)
    os.chdir(paths.root)
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or "dagster"
    if port is None:
        # Chosen here and handed to Dagster: left to choose, it would serve elsewhere when the
        # port is taken, and the address said here would be another server's.
        port = DEFAULT_UI_PORT
        if port_in_use(port):
            port = free_port()
            say(
                f"port {DEFAULT_UI_PORT} is in use: the UI takes port {port} instead"
                " (`rastro demo --port N` chooses one)"
            )
        extra_args = ["--port", str(port), *extra_args]
    say(f"data in {paths.data}; starting Dagster (UI and daemon) on http://127.0.0.1:{port}")
    for line in linked_lines(paths):
        say(line)
    why = "as set" if base.get(AXIS_SETTING) else "the first day these accounts are owed"
    say(f"the partitions' date axis starts on {env[AXIS_SETTING]} ({AXIS_SETTING}, {why})")
    say(
        f"Dagster's instance: {paths.dagster_home}/dagster.yaml (DAGSTER_HOME), a copy of the"
        " dagster.yaml here made at each start"
    )
    dev_args, threshold = dagster_log_level(extra_args)
    if threshold >= logging.WARNING:
        say(
            "of Dagster's log, only warnings and errors follow; the UI keeps every run's whole"
            " log (`rastro demo -- --log-level info` shows more here)"
        )
    watcher = Watcher(
        paths,
        str(port),
        Path(Settings.from_env(env).snapshot_path),
        rastro_command(paths.root),
    )
    argv = [dagster, "dev", "-w", "workspace.yaml", *dev_args]
    with graph_server.serving(paths) as graph:
        aside = graph_server.set_aside(base)
        say(
            f"the fake Meta Graph at {graph.url} ({paths.graph_file.name} in data/;"
            " `rastro demo trouble` stages trouble in it)"
            + (f"; {' and '.join(aside)} from the environment set aside" if aside else "")
        )
        env = graph_server.graph_environment(env, graph)
        return supervise(argv, env, watcher, DagsterOutput(threshold), STOP_RUNS)


def _port(extra_args: list[str]) -> int | None:
    """The UI's port given to `dagster dev` among `extra_args`, if any."""
    for index, arg in enumerate(extra_args):
        if arg in ("--port", "-p") and index + 1 < len(extra_args):
            value = extra_args[index + 1]
        elif arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        else:
            continue
        return int(value) if value.isdigit() else None
    return None


def port_in_use(port: int) -> bool:
    """Whether the UI could not listen on loopback's `port`, as Dagster's webserver tries it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
