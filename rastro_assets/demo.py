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
warehouse use the same key file when the variable is unset (`demo_key_file`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO

import duckdb

from rastro_assets.analytics.frames import open_snapshot
from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.planner import cadence
from rastro_assets.planner.coverage import backfill_first_day
from rastro_assets.planner.history import planned_accounts
from rastro_assets.process_settings import Settings
from rastro_assets.settings import project_root
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault, generate_key, read_key_file
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked
from rastro_fake_graph.world import DEMO_TOKEN, FakeWorld

DEMO_CONNECTION = "demo"
KEY_FILE_NAME = "secrets.key"
AXIS_SETTING = "RASTRO_PARTITIONS_START"
DEMO_SITES = {"demo-shop": "Demo shop", "demo-clinic": "Demo clinic"}
DEMO_LINKS = {"demo-shop": ("act_1001", "act_1002"), "demo-clinic": ("act_1002", "act_1003")}
PREFIX = "rastro demo:"
# Harmless warnings Dagster prints on every start of the demo, each matched by the start
# of its message (PYTHONWARNINGS takes no Dagster category without importing Dagster
# first): the `dagster dev` command superseded by `dg dev`, which needs a `dg` project;
# the preview and beta APIs the code location uses on purpose.
QUIETED_WARNINGS = (
    "Function `dev_command` is superseded",
    "Specifying a partitions_def on an AssetCheckSpec is currently in preview",
    "Parameter `owners` of initializer `SensorDefinition.__init__` is currently in beta",
)
# Dagster's planned events as one per asset and run instead of one per account-day: the
# backfill daemon submits a backfill's runs several times faster, and the partitions grid
# no longer marks a running or failed backfill run's days (docs/operations.md, "Planned
# events"). Dagster reads it in the process that creates a run (daemon, webserver); an
# operator's own value wins.
PLANNED_SUBSET_VARIABLE = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
# Added to the caller's umask for Dagster: no group or other bits on anything it creates.
PRIVATE_UMASK = 0o077
# Dagster's INFO lines (each sensor tick, each backfill iteration) would bury the demo's own
# and "ready" with them; the UI keeps them. `--log-level` after `--` asks for more.
DAGSTER_LOG_LEVEL = "warning"
# A warning the demo answers in its own words before Dagster prints it: `dagster dev` sees
# the repo's dagster.yaml beside a DAGSTER_HOME elsewhere, where the demo copied it.
EXPLAINED_WARNINGS = ("Found a dagster instance configuration value (dagster.yaml)",)
# A Dagster log record as its console formatters print it (colours aside).
LOG_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - \S+ - (?P<level>[A-Z]+) - (?P<message>.*)"
)
COLOURS = re.compile(r"\x1b\[[0-9;]*m")
# Lines that start something to read whatever came before: a hidden record's message never
# swallows them.
ALARM = re.compile(
    r"^(Traceback \(most recent call last\)|\S*(Error|Exception|Warning)\b|\S+\.py:\d+: )"
)
# Stopping Dagster waits this long for its last lines to be passed on.
RELAY_DRAIN_SECONDS = 5.0
TICK_SECONDS = 2.0
PROGRESS_SECONDS = 20.0
# An unchanged progress line is said again only this long after it was said.
PROGRESS_REPEAT_SECONDS = 120.0
# A look at the warehouse gives way to the pipeline's writers at once: the next tick retries.
LOOK_LOCK_WAIT_SECONDS = 0.5
# Stopping Dagster takes a few seconds; after this long the demo gives up waiting.
STOP_SECONDS = 25.0
SAMPLE_QUERY = (
    "SELECT ad_account_id, min(day) AS first_day, max(day) AS last_day, sum(spend) AS spend"
    " FROM ad_spend_daily GROUP BY ALL ORDER BY ALL"
)


@dataclass(frozen=True)
class DemoPaths:
    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def key_file(self) -> Path:
        return self.data / KEY_FILE_NAME

    @property
    def duckdb(self) -> Path:
        return self.data / "rastro.duckdb"

    @property
    def dagster_home(self) -> Path:
        return self.data / "dagster_home"


def demo_key_file(duckdb_path: str | os.PathLike[str], cwd: Path | None = None) -> Path | None:
    """The demo's key file when `duckdb_path` is the demo's warehouse seen from `cwd` (the
    checkout's `data/rastro.duckdb`, with `data/secrets.key` beside it); else None.

    What `rastro demo` hands its daemon when RASTRO_SECRETS_KEY is unset, so a token a
    command seals with it there is one the demo's daemon opens.
    """
    root = project_root(cwd)
    if root is None or not (root / "dagster.yaml").exists():
        return None
    paths = DemoPaths(root)
    if not os.path.lexists(paths.key_file):
        return None
    if os.path.realpath(duckdb_path) != os.path.realpath(paths.duckdb):
        return None
    return paths.key_file


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
    environ = os.environ if environ is None else environ
    key = (environ.get(ENV_VAR) or "").strip() or demo_key(paths)
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
        "RASTRO_META_FAKE": "true",
        "RASTRO_DUCKDB_PATH": str(paths.duckdb),
        "DAGSTER_HOME": str(paths.dagster_home),
        # Someone trying the demo waits for their first query: publish within a minute.
        "RASTRO_ANALYTICS_LAG_SECONDS": environ.get("RASTRO_ANALYTICS_LAG_SECONDS") or "60",
        # The grid starts where the demo's accounts are first owed: the default axis start
        # would show the days before as "missing" partitions no account is ever owed.
        AXIS_SETTING: environ.get(AXIS_SETTING) or axis_start.isoformat(),
        PLANNED_SUBSET_VARIABLE: environ.get(PLANNED_SUBSET_VARIABLE) or "true",
    }


def first_owed_day(accounts: list[registry.LinkedAccount], now: datetime) -> date:
    """The first local day any of `accounts` is owed: its backfill's first, from its link."""
    return min(
        (
            backfill_first_day(local_date(account.created_at or now, account.timezone))
            for account in accounts
        ),
        default=backfill_first_day(now.date()),
    )


def _demo_token_stored(con: duckdb.DuckDBPyConnection, vault: Vault) -> bool:
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


# The demo's own lines and Dagster's, passed on from other threads, stay whole lines.
_OUTPUT = threading.Lock()


def say(line: str) -> None:
    with _OUTPUT:
        print(f"{PREFIX} {line}", flush=True)


def linked_lines(paths: DemoPaths) -> list[str]:
    """What the demo linked: its sites, and each account with its timezone, currency, sites."""
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        accounts = registry.linked_accounts(con)
        links = con.execute(
            "SELECT ad_account_id, list(site_id ORDER BY site_id) FROM site_ad_accounts"
            " GROUP BY ALL"
        ).fetchall()
    sites_of = dict(links)
    sites = ", ".join(f"{site} ({name})" for site, name in DEMO_SITES.items())
    lines = [f"sites {sites}; {len(accounts)} fake Meta accounts linked:"]
    lines += [
        f"  {a.ad_account_id} {a.name!r} ({a.timezone}, {a.currency})"
        f" -> {', '.join(sites_of.get(a.ad_account_id, []))}"
        for a in accounts
    ]
    return lines


@dataclass(frozen=True)
class Progress:
    """The linked accounts' first backfills, as `rastro status` tells them."""

    accounts: int
    done: int
    days_read: int
    days_owed: int
    stuck: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.done == self.accounts

    def line(self) -> str:
        text = (
            f"backfill: {self.done} of {self.accounts} accounts done,"
            f" {self.days_read}/{self.days_owed} account-days"
        )
        return "; ".join([text, *self.stuck])


def read_progress(duckdb_path: Path, now: datetime | None = None) -> Progress | None:
    """The backfills' progress from one brief read-only look; None while writers hold the file."""
    warehouse = Warehouse(duckdb_path, lock_wait_seconds=LOOK_LOCK_WAIT_SECONDS)
    try:
        with warehouse.connect(read_only=True) as con:
            accounts = planned_accounts(con)
    except (WarehouseLocked, duckdb.Error):
        return None
    now = now or datetime.now(UTC)
    done = days_read = days_owed = 0
    stuck = []
    for account in accounts:
        status = cadence.status(account.state, now)
        if status.backfill is None:
            done += 1
            days_read += cadence.BACKFILL_DAYS
            days_owed += cadence.BACKFILL_DAYS
        else:
            days_read += status.backfill[0]
            days_owed += status.backfill[1]
        if status.state in ("error", "paused"):
            stuck.append(f"{status.ad_account_id} {status.state}: {status.last_error}")
    return Progress(len(accounts), done, days_read, days_owed, tuple(stuck))


def snapshot_ready(analytics_path: Path, accounts: int) -> bool:
    """Whether the analytics snapshot was published after every account's backfill."""
    try:
        with open_snapshot(analytics_path) as con:
            rows = con.execute(
                "SELECT count(*), count(backfill_total_days) FROM account_sync_status"
            ).fetchone()
    except (OSError, duckdb.Error, LookupError, ValueError):
        # Missing, being replaced, or from an older format: the next look decides.
        return False
    return rows is not None and rows[0] >= accounts and rows[1] == 0


def ui_up(port: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


class Watcher:
    """The demo's own lines while Dagster runs: the UI once it answers, then the backfills'
    progress every `PROGRESS_SECONDS` until the snapshot holds them all, then "ready"."""

    def __init__(
        self,
        paths: DemoPaths,
        port: str,
        analytics_path: Path,
        rastro: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self.port = port
        self.analytics_path = analytics_path
        self.rastro = rastro
        self.clock = clock
        self.ui_said = False
        self.ready = False
        self.next_look = clock()
        self.last: Progress | None = None
        self.last_said = ""
        self.said_at = float("-inf")

    def tick(self) -> None:
        if not self.ui_said and ui_up(self.port):
            self.ui_said = True
            say(f"UI at http://127.0.0.1:{self.port} (Ctrl-C stops the demo)")
        if self.ready or self.clock() < self.next_look:
            return
        progress = read_progress(self.paths.duckdb)
        if progress is None:
            return  # the writers hold the file: look again next tick
        self.next_look = self.clock() + PROGRESS_SECONDS
        if progress.finished and snapshot_ready(self.analytics_path, progress.accounts):
            self.ready = True
            if self.last is not None and not self.last.finished:
                say(progress.line())
            say(f'ready: try {self.rastro} sql "{SAMPLE_QUERY}"')
            return
        if progress.finished:
            if self.last is None or not self.last.finished:
                say(f"{progress.line()}; publishing the analytics snapshot")
        else:
            self.say_progress(progress.line())
        self.last = progress

    def say_progress(self, line: str) -> None:
        """`line`, unless it was just said: a slow backfill would otherwise repeat it every
        look, and push "ready" far down the terminal."""
        if line == self.last_said and self.clock() - self.said_at < PROGRESS_REPEAT_SECONDS:
            return
        say(line)
        self.last_said, self.said_at = line, self.clock()


class DagsterOutput:
    """Which of Dagster's lines on one stream the demo passes on: records at `threshold` or
    above (its warnings and errors by default) and every line that is no record (a
    traceback, a Python warning, a crash's last words), never a warning the demo has
    already explained. A record's further lines go with it, unless one starts an alarm."""

    def __init__(self, threshold: int = logging.WARNING) -> None:
        self.threshold = threshold
        self.hiding = False

    def keep(self, line: str) -> bool:
        plain = COLOURS.sub("", line)
        record = LOG_RECORD.match(plain)
        if record is not None:
            level = logging.getLevelName(record["level"])
            below = isinstance(level, int) and level < self.threshold
            self.hiding = below or record["message"].startswith(EXPLAINED_WARNINGS)
            return not self.hiding
        if self.hiding and not ALARM.match(plain):
            return False
        self.hiding = False
        return True


def relay(source: IO[bytes], sink: IO[str], output: DagsterOutput) -> None:
    """Pass `source`'s lines that `output` keeps on to `sink`, until every writer closes it."""
    with source:
        for raw in iter(source.readline, b""):
            if not output.keep(raw.decode(errors="replace")):
                continue
            whole = raw if raw.endswith(b"\n") else raw + b"\n"
            with _OUTPUT, suppress(OSError, ValueError):
                sink.flush()
                # As Dagster wrote them: no encoding of the terminal's may mangle or drop them.
                binary = getattr(sink, "buffer", None)
                if binary is not None:
                    binary.write(whole)
                    binary.flush()
                else:
                    sink.write(whole.decode(errors="replace"))
                    sink.flush()


def dagster_log_level(extra_args: list[str]) -> tuple[list[str], int]:
    """`dagster dev`'s arguments with a log level (the user's, else warnings), and the level
    of the lines to pass on."""
    for index, arg in enumerate(extra_args):
        if arg == "--log-level" and index + 1 < len(extra_args):
            chosen = extra_args[index + 1]
        elif arg.startswith("--log-level="):
            chosen = arg.split("=", 1)[1]
        else:
            continue
        level = logging.getLevelName(chosen.upper())
        return extra_args, level if isinstance(level, int) else logging.WARNING
    return [*extra_args, "--log-level", DAGSTER_LOG_LEVEL], logging.WARNING


def quiet_warnings(environ: Mapping[str, str]) -> str:
    """PYTHONWARNINGS with the known harmless warnings ignored, the caller's entries kept."""
    ours = [f"ignore:{message}" for message in QUIETED_WARNINGS]
    theirs = [entry for entry in (environ.get("PYTHONWARNINGS") or "").split(",") if entry]
    return ",".join([*theirs, *ours])


def rastro_command(root: Path) -> str:
    """How to call this install's `rastro` from the repo root."""
    rastro = Path(sys.executable).parent / "rastro"
    try:
        return str(rastro.relative_to(root))
    except ValueError:
        return str(rastro)


def _start_child() -> None:
    """In the child before exec: die with the demo, and create every file private.

    Dagster creates its storage, run logs and directories with the process umask
    (under umask 000: logs 0666, directories 0777); `dagster dev` and every process it
    starts (daemon, webserver, code server, run workers) inherit this one.
    """
    _die_with_parent()
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the demo dies, even by SIGKILL (Linux); and
    SIGINT and SIGTERM at their defaults, since a demo started in the background of a
    script inherits SIGINT ignored, and Dagster would then never get the Ctrl-C handed on."""
    for handed_on in (signal.SIGINT, signal.SIGTERM):
        signal.signal(handed_on, signal.SIG_DFL)
    with suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def run(root: Path, extra_args: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Prepare the demo, then run `dagster dev` and say how the demo is doing until it stops."""
    paths = DemoPaths(root.resolve())
    if not (paths.root / "workspace.yaml").exists():
        print("rastro: error: run `rastro demo` from the repo root", file=sys.stderr)
        return 2
    base = dict(os.environ if environ is None else environ)
    env = {**base, **prepare(paths, environ=base)}
    env["PYTHONWARNINGS"] = quiet_warnings(base)
    os.chdir(paths.root)
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or "dagster"
    port = _port(extra_args)
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
        port,
        Path(Settings.from_env(env).snapshot_path),
        rastro_command(paths.root),
    )
    argv = [dagster, "dev", "-w", "workspace.yaml", *dev_args]
    return supervise(argv, env, watcher, DagsterOutput(threshold))


def supervise(
    argv: list[str],
    env: Mapping[str, str],
    watcher: Watcher,
    output: DagsterOutput | None = None,
) -> int:
    """Run `argv` in a process group of its own, under a umask denying group and others; hand
    it each SIGINT/SIGTERM, watch meanwhile.

    Its own group, so that a signal to the demo's group (Ctrl-C in a terminal) reaches
    Dagster once, from here: twice, `dagster dev` aborts its own shutdown halfway.
    With `output`, its stdout and stderr pass through here, each sifted on its own
    (`DagsterOutput`); without, they are the demo's own.
    """
    piped = subprocess.PIPE if output is not None else None
    child = subprocess.Popen(
        argv,
        env=env,
        process_group=0,
        preexec_fn=_start_child,
        stdout=piped,
        stderr=piped,
    )
    relays = []
    if output is not None:
        for source, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            sifter = DagsterOutput(output.threshold)
            # Daemon threads: a run worker that outlives Dagster may hold the pipe open.
            thread = threading.Thread(target=relay, args=(source, sink, sifter), daemon=True)
            thread.start()
            relays.append(thread)
    stopping: list[int] = []

    def hand_on(signum: int, _frame) -> None:
        stopping.append(signum)
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    previous = {sig: signal.signal(sig, hand_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    deadline: float | None = None
    try:
        while True:
            try:
                code = child.wait(timeout=TICK_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            if stopping:
                deadline = deadline or time.monotonic() + STOP_SECONDS
                if time.monotonic() >= deadline:
                    with suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGKILL)
                    code = child.wait()
                    break
                continue
            watcher.tick()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        drained_by = time.monotonic() + RELAY_DRAIN_SECONDS
        for thread in relays:
            thread.join(max(drained_by - time.monotonic(), 0))
    return 128 - code if code < 0 else code


def _port(extra_args: list[str]) -> str:
    for flag in ("--port", "-p"):
        if flag in extra_args[:-1]:
            return extra_args[extra_args.index(flag) + 1]
    return "3000"
