"""`rastro demo`'s preparation: idempotent, and a correct hand-over to `dagster dev`."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rastro_assets import demo
from rastro_assets.demo import dagster_output, watch
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_fake_graph import DEMO_TOKEN, FakeWorld

REPO = Path(__file__).resolve().parents[1]
TABLES = ("sites", "meta_connections", "meta_ad_accounts", "site_ad_accounts")


@pytest.fixture
def paths(tmp_path: Path) -> DemoPaths:
    """An empty repo root: its dagster.yaml and workspace.yaml, no data/ yet."""
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    shutil.copy(REPO / "workspace.yaml", tmp_path / "workspace.yaml")
    return DemoPaths(tmp_path)


def snapshot(paths: DemoPaths) -> dict[str, list[tuple]]:
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        return {
            table: con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall() for table in TABLES
        }


def test_what_prepare_creates_is_private_under_any_umask(paths: DemoPaths, now):
    previous = os.umask(0)
    try:
        demo.prepare(paths, now=now, environ={})
    finally:
        os.umask(previous)
    modes = {
        path: stat.S_IMODE(path.stat().st_mode)
        for path in (paths.data, paths.dagster_home, paths.key_file, paths.duckdb)
    }
    assert modes == {
        paths.data: 0o700,
        paths.dagster_home: 0o700,
        paths.key_file: 0o600,
        paths.duckdb: 0o600,
    }


def test_prepare_twice_reuses_everything(paths: DemoPaths, now):
    first = demo.prepare(paths, now=now, environ={})
    key = paths.key_file.read_text().strip()
    assert stat.S_IMODE(paths.key_file.stat().st_mode) == 0o600
    rows = snapshot(paths)

    second = demo.prepare(paths, now=now + timedelta(days=1), environ={})
    assert second == first
    assert paths.key_file.read_text().strip() == key
    assert snapshot(paths) == rows  # same sealed token, same link times: nothing rewritten

    assert first == {
        ENV_VAR: key,
        "RASTRO_META_FAKE": "true",
        "RASTRO_DUCKDB_PATH": str(paths.data / "rastro.duckdb"),
        "DAGSTER_HOME": str(paths.data / "dagster_home"),
        "RASTRO_ANALYTICS_LAG_SECONDS": "60",
        # The first day the demo's accounts are owed, kept on the second start (days later).
        "RASTRO_PARTITIONS_START": "2026-09-02",
        "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "true",
        # A staged throttle is told within minutes of the rehearsal, not hours.
        "RASTRO_ALERT_RATE_LIMITED_MINUTES": "1",
    }
    assert (paths.dagster_home / "dagster.yaml").read_text() == (
        paths.root / "dagster.yaml"
    ).read_text()


def test_prepare_links_the_fake_worlds_accounts(paths: DemoPaths, now):
    env = demo.prepare(paths, now=now, environ={})
    world = FakeWorld.demo()
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        sites = con.execute("SELECT site_id FROM sites ORDER BY ALL").fetchall()
        links = con.execute("SELECT site_id, ad_account_id FROM site_ad_accounts").fetchall()
        accounts = registry.linked_accounts(con)
        connection = registry.get_connection(con, demo.DEMO_CONNECTION)
    assert [site for (site,) in sites] == sorted(demo.DEMO_SITES)
    assert sorted(links) == sorted(
        (site, account) for site, ids in demo.DEMO_LINKS.items() for account in ids
    )
    assert [account.ad_account_id for account in accounts] == ["act_1001", "act_1002", "act_1003"]
    for account in accounts:
        fake = world.accounts[account.ad_account_id]
        assert (account.timezone, account.currency, account.name) == (
            fake.timezone,
            fake.currency,
            fake.name,
        )
        assert account.connection_id == demo.DEMO_CONNECTION
        assert account.created_at == now
    assert len({account.timezone for account in accounts}) == 3
    assert len({account.currency for account in accounts}) == 3
    assert connection.status == ConnectionStatus.ACTIVE
    vault = Vault.from_env({ENV_VAR: env[ENV_VAR]})
    assert vault.open(demo.DEMO_CONNECTION, connection.sealed_token) == DEMO_TOKEN
    assert DEMO_TOKEN.encode() not in paths.duckdb.read_bytes()


def test_planned_events_as_subsets_unless_the_operator_says_otherwise(
    paths: DemoPaths, now
):
    # One planned event per asset and run: the demo's backfill runs are submitted faster
    # (docs/running.md, "Planned events"); an operator's own value is kept.
    variable = demo.PLANNED_SUBSET_VARIABLE
    assert variable == "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
    assert demo.prepare(paths, now=now, environ={})[variable] == "true"
    assert demo.prepare(paths, now=now, environ={variable: "false"})[variable] == "false"


def test_a_key_in_the_environment_wins_and_the_demo_token_follows(paths: DemoPaths, now):
    demo.prepare(paths, now=now, environ={})
    links = snapshot(paths)["site_ad_accounts"]
    own_key = generate_key()
    env = demo.prepare(paths, now=now, environ={ENV_VAR: own_key})
    assert env[ENV_VAR] == own_key
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        connection = registry.get_connection(con, demo.DEMO_CONNECTION)
    sealed = connection.sealed_token
    assert Vault.from_env({ENV_VAR: own_key}).open(demo.DEMO_CONNECTION, sealed) == DEMO_TOKEN
    assert snapshot(paths)["site_ad_accounts"] == links


def test_a_paused_demo_connection_is_revived(paths: DemoPaths, now):
    demo.prepare(paths, now=now, environ={})
    with Warehouse(paths.duckdb).connect() as con:
        sealed_at = registry.get_connection(con, demo.DEMO_CONNECTION).sealed_at
        registry.mark_connection_invalid(
            con, demo.DEMO_CONNECTION, "dead", now, token_sealed_at=sealed_at
        )
    demo.prepare(paths, now=now + timedelta(minutes=1), environ={})
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        assert registry.get_connection(con, demo.DEMO_CONNECTION).status == ConnectionStatus.ACTIVE


def handed_to_supervise(monkeypatch) -> list[tuple]:
    """What `demo.run` hands `supervise`, which returns at once."""
    handed = []

    def supervise(argv, env, watcher, output, stop_runs):
        handed.append((argv, env, watcher, output))
        assert stop_runs == demo.STOP_RUNS
        return 0

    monkeypatch.setattr(demo, "supervise", supervise)
    return handed


def test_run_prepares_then_supervises_dagster_dev(paths: DemoPaths, monkeypatch, capsys):
    handed = handed_to_supervise(monkeypatch)
    monkeypatch.chdir(REPO)
    environ = {"KEEP": "me", "PYTHONWARNINGS": "error::ResourceWarning"}
    port = str(demo.free_port())
    assert demo.run(paths.root, ["--port", port], environ=environ) == 0
    [(argv, env, watcher, output)] = handed
    assert Path(argv[0]).name == "dagster"
    assert argv[1:] == ["dev", "-w", "workspace.yaml", "--port", port, "--log-level", "warning"]
    assert output.threshold == logging.WARNING
    assert env["KEEP"] == "me"
    assert env["DAGSTER_HOME"] == str(paths.root.resolve() / "data" / "dagster_home")
    assert env[ENV_VAR] == paths.key_file.read_text().strip()
    assert env["PYTHONWARNINGS"].split(",")[0] == "error::ResourceWarning"
    assert Path.cwd() == paths.root.resolve()
    assert (watcher.port, watcher.analytics_path) == (port, paths.data / "analytics.duckdb")
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("rastro demo: ") for line in lines)
    assert lines[0].startswith("rastro demo: data in ")
    assert f"http://127.0.0.1:{port} " in lines[0] + " "
    world = FakeWorld.demo()
    for account in ("act_1001", "act_1002", "act_1003"):
        fake = world.accounts[account]
        [line] = [line for line in lines if f" {account} " in line]
        assert f"({fake.timezone}, {fake.currency})" in line
    assert any("-> demo-clinic, demo-shop" in line for line in lines)  # act_1002's two sites
    home = paths.root.resolve() / "data" / "dagster_home"
    assert any(f"{home}/dagster.yaml (DAGSTER_HOME)" in line for line in lines)
    assert any("only warnings and errors follow" in line for line in lines)


@contextmanager
def port_3000_held() -> Iterator[None]:
    """Port 3000 held by a server that is not Dagster's: this one, unless another holds it."""
    server = None
    with suppress(OSError):
        server = socket.create_server(("127.0.0.1", demo.DEFAULT_UI_PORT))
    try:
        assert demo.port_in_use(demo.DEFAULT_UI_PORT)
        yield
    finally:
        if server is not None:
            server.close()


def test_with_3000_taken_the_demo_hands_dagster_a_free_port_and_says_so(
    paths: DemoPaths, monkeypatch, capsys
):
    handed = handed_to_supervise(monkeypatch)
    monkeypatch.chdir(REPO)
    with port_3000_held():
        assert demo.run(paths.root, [], environ={}) == 0
    [(argv, _env, watcher, _output)] = handed
    port = argv[argv.index("--port") + 1]
    assert port != "3000" and watcher.port == port
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"rastro demo: port 3000 is in use: the UI takes port {port} instead"
        " (`rastro demo --port N` chooses one)"
    )
    assert f"on http://127.0.0.1:{port}" in lines[1]


def test_a_port_asked_for_that_is_taken_is_refused_in_one_line(
    paths: DemoPaths, monkeypatch, capsys
):
    handed = handed_to_supervise(monkeypatch)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert demo.run(paths.root, ["--port", str(port)], environ={}) == 2
    assert handed == []
    assert capsys.readouterr().err.splitlines() == [
        f"rastro: error: port {port} is in use: choose a free one with `rastro demo --port N`"
    ]
    assert not paths.data.exists()


class Answering(BaseHTTPRequestHandler):
    """A loopback server answering every GET with `self.server.body`."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def answering(body: bytes) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    server.body = body
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield str(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_the_ui_is_up_once_dagsters_webserver_answers_not_any_server():
    with answering(b"<html>Grafana</html>") as port:
        assert not watch.ui_up(port)
    with answering(b'{"dagster_webserver_version": "1.13.0"}') as port:
        assert watch.ui_up(port)
    assert not watch.ui_up(str(demo.free_port()))


def test_ready_waits_for_the_uis_address(paths: DemoPaths, monkeypatch, capsys):
    """On a restart the snapshot is ready at once and the UI answers seconds later."""
    clock = Clock()
    monkeypatch.setattr(watch, "read_progress", lambda path: watch.Progress(3, 3, 270, 270))
    monkeypatch.setattr(watch, "snapshot_ready", lambda path, accounts: True)
    up = iter([False, False, False, True])
    monkeypatch.setattr(watch, "ui_up", lambda port: next(up, True))
    watcher = watch.Watcher(paths, "3001", paths.data / "analytics.duckdb", "rastro", clock)
    for at in (0, 2, 4, 6, 8):
        clock.now = at
        watcher.tick()
    assert capsys.readouterr().out.splitlines() == [
        "rastro demo: UI at http://127.0.0.1:3001 (Ctrl-C stops the demo)",
        f'rastro demo: ready: try rastro sql "{watch.SAMPLE_QUERY}"',
    ]


QUIET_PROBE = """
import warnings
import dagster as dg
warnings.warn("Function `dev_command` is superseded and its usage is discouraged.",
              dg.SupersessionWarning)
dg.AssetCheckSpec("c", asset="a", partitions_def=dg.StaticPartitionsDefinition(["x"]))
dg.SensorDefinition(name="s", evaluation_fn=lambda context: None, job_name="j", owners=["team:ads"])
warnings.warn("an unrelated warning")
"""


def test_the_quieted_warnings_are_dagsters_own_and_only_those():
    env = {**os.environ, "PYTHONWARNINGS": dagster_output.quiet_warnings({})}
    result = subprocess.run(
        [sys.executable, "-c", QUIET_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" in result.stderr and "an unrelated warning" in result.stderr
    for message in dagster_output.QUIETED_WARNINGS:
        assert message not in result.stderr
    assert len(dagster_output.quiet_warnings({"PYTHONWARNINGS": "default"}).split(",")) == 4


def test_progress_of_a_fresh_demo_and_no_snapshot_yet(paths: DemoPaths, now):
    demo.prepare(paths, now=now, environ={})
    progress = watch.read_progress(paths.duckdb, now)
    assert progress == watch.Progress(3, 0, 0, 270)
    assert progress.line() == "backfill: 0 of 3 accounts done, 0/270 account-days"
    assert not watch.snapshot_ready(paths.data / "analytics.duckdb", 3)


def test_a_look_gives_way_to_a_writer(paths: DemoPaths, now, monkeypatch):
    demo.prepare(paths, now=now, environ={})
    monkeypatch.setattr(watch, "LOOK_LOCK_WAIT_SECONDS", 0.0)
    # What a look meets while the pipeline writes: another process holding the file.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; con = duckdb.connect(sys.argv[1]); print('held',"
            " flush=True); sys.stdin.read()",
            str(paths.duckdb),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert watch.read_progress(paths.duckdb, now) is None
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert watch.read_progress(paths.duckdb, now) is not None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watcher_says_ui_progress_then_ready_once(paths: DemoPaths, monkeypatch, capsys):
    clock = Clock()
    looks = iter(
        [
            watch.Progress(3, 0, 0, 270),
            None,  # the writers hold the file: nothing said, looked at again next tick
            watch.Progress(3, 2, 200, 270),
            watch.Progress(3, 3, 270, 270),
            watch.Progress(3, 3, 270, 270),
        ]
    )
    published = iter([False, True])
    monkeypatch.setattr(watch, "read_progress", lambda path: next(looks))
    monkeypatch.setattr(watch, "snapshot_ready", lambda path, accounts: next(published))
    up = iter([False, True])
    monkeypatch.setattr(watch, "ui_up", lambda port: next(up, True))
    snapshot = paths.data / "analytics.duckdb"
    watcher = watch.Watcher(paths, "3001", snapshot, ".venv/bin/rastro", clock)
    for at in (0, 2, 3, 4, 30, 45, 60, 80, 100, 200):
        clock.now = at
        watcher.tick()
    assert capsys.readouterr().out.splitlines() == [
        "rastro demo: backfill: 0 of 3 accounts done, 0/270 account-days",
        "rastro demo: UI at http://127.0.0.1:3001 (Ctrl-C stops the demo)",
        "rastro demo: backfill: 2 of 3 accounts done, 200/270 account-days",
        "rastro demo: backfill: 3 of 3 accounts done, 270/270 account-days;"
        " publishing the analytics snapshot",
        f'rastro demo: ready: try .venv/bin/rastro sql "{watch.SAMPLE_QUERY}"',
    ]


STOPPABLE = """
import signal, sys
from pathlib import Path
from rastro_assets.demo import dagster_process

class Quiet:
    def tick(self):
        pass

# Started as in a script's background (`rastro demo &`): SIGINT ignored, which a child
# inherits unless the demo restores it.
signal.signal(signal.SIGINT, signal.SIG_IGN)
# A child that outlives the demo's group: only a signal handed on reaches it.
child = [sys.executable, "-c", "import time; print('child up', flush=True); time.sleep(600)"]
sys.exit(dagster_process.supervise(child, {}, Quiet()))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_demos_group_stops_dagster_too(tmp_path: Path, sig):
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPABLE],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "child up"
        os.killpg(process.pid, sig)
        assert process.wait(timeout=30) == 128 + sig
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # The child, in a group of its own, is gone too: nothing left in the session.
    assert not session_members(process.pid)


def session_members(sid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.append(int(entry.name))
    return found


def test_ctrl_c_before_dagster_starts_says_stopped_not_a_traceback(
    paths: DemoPaths, monkeypatch, capsys
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "prepare", interrupted)
    assert demo.run(paths.root, ["--port", str(demo.free_port())], environ={}) == 130
    assert capsys.readouterr().out.splitlines() == ["rastro demo: stopped"]


def test_run_outside_the_repo_root(tmp_path: Path, capsys):
    assert demo.run(tmp_path, [], environ={}) == 2
    assert "repo root" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("hour", [1, 12, 23])
def test_the_demos_date_axis_starts_on_the_first_day_its_accounts_are_owed(
    paths: DemoPaths, now, hour
):
    """No day of the demo's grid is one no account is owed (it would read as "missing"), and
    no owed day is left off the axis, whatever the hour its accounts' local days differ."""
    linked_at = now.replace(hour=hour)
    env = demo.prepare(paths, now=linked_at, environ={})
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        accounts = planned_accounts(con)
    first_owed = min(cadence.plan(account.state, linked_at).since for account in accounts)
    assert {cadence.plan(account.state, linked_at).kind for account in accounts} == {"backfill"}
    assert date.fromisoformat(env["RASTRO_PARTITIONS_START"]) == first_owed


def test_an_axis_start_already_set_wins_over_the_demos(paths: DemoPaths, now):
    env = demo.prepare(paths, now=now, environ={"RASTRO_PARTITIONS_START": "2026-01-01"})
    assert env["RASTRO_PARTITIONS_START"] == "2026-01-01"


# Dagster's output, sifted -------------------------------------------------------

# What `dagster dev` and its processes print in the demo, colours included: the run worker's
# events come at DEBUG whatever `--log-level` says.
DAGSTER_LINES = [
    "\x1b[32m2026-12-06 00:11:54 +0000\x1b[0m - dagster - \x1b[34mWARNING\x1b[0m - Found a"
    " dagster instance configuration value (dagster.yaml) in the current folder, but your"
    " DAGSTER_HOME environment variable is set to /r/data/dagster_home.",
    "\x1b[32m2026-12-06 00:11:55 +0000\x1b[0m - dagster - \x1b[34mINFO\x1b[0m - Launching"
    " Dagster services...",
    "\x1b[32m2026-12-06 00:12:13 +0000\x1b[0m - dagster - \x1b[34mDEBUG\x1b[0m - __ASSET_JOB"
    " - 801af1a2 - 28994 - spend_backfill - STEP_START - Started execution of step.",
    "2026-12-06 00:12:37 +0000 - dagster.daemon.BackfillDaemon - INFO - Backfill iteration"
    " summary:",
    "**Assets materialized since last iteration:**",
    "- spend_backfill: {act_1003, act_1001, act_1002}",
    "2026-12-06 00:13:00 +0000 - dagster.daemon.SensorDaemon - WARNING - Sensor meta_cadence"
    " took 31 s",
    "2026-12-06 00:13:01 +0000 - dagster - ERROR - __ASSET_JOB - 801af1a2 - spend_backfill -"
    " STEP_FAILURE - Execution of step failed.",
    "dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred",
    '  File "/x.py", line 3, in f',
    "2026-12-06 00:13:02 +0000 - dagster - DEBUG - __ASSET_JOB - 801af1a2 - RUN_FAILURE",
    "Traceback (most recent call last):",
    '  File "/y.py", line 1, in <module>',
    "Killed",
]


def sift(lines: list[str], threshold: int = logging.WARNING) -> list[str]:
    output = dagster_output.DagsterOutput(threshold)
    kept = [out for line in lines for out in output.sift(line + "\n")] + output.finish()
    return [line.removesuffix("\n") for line in kept]


def test_of_dagsters_lines_warnings_errors_and_what_is_no_record_pass():
    kept = sift(DAGSTER_LINES)
    assert kept == [
        DAGSTER_LINES[6],
        DAGSTER_LINES[7],
        "dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred",
        '  File "/x.py", line 3, in f',
        # A hidden record's lines never swallow a traceback or a crash after it.
        "Traceback (most recent call last):",
        '  File "/y.py", line 1, in <module>',
        "Killed",
    ]
    assert not any("DEBUG" in line or "INFO" in line for line in kept)


def test_a_log_level_asked_for_shows_more_but_never_the_explained_warning():
    kept = sift(DAGSTER_LINES, logging.INFO)
    assert DAGSTER_LINES[1] in kept and "- spend_backfill: {act_1003, act_1001, act_1002}" in kept
    assert not any("DEBUG" in line for line in kept)
    assert not any("Found a dagster instance" in line for line in sift(DAGSTER_LINES, 0))


# A wave failing on purpose, as its run worker printed it (frames shortened), then a crash.
RUN_ID = "330ee463-4930-4ea1-97a9-c772c4b3263d"
WORDS = (
    "every account of the wave failed (3): META_TOKEN_INVALID on act_1001, act_1002, act_1003"
    ' (docs/errors.md, "META_TOKEN_INVALID")'
)
DAGSTER_FRAMES = [
    "Stack Trace:",
    '  File "/v/dagster/_core/execution/plan/execute_plan.py", line 243, in dagster_event_seq',
    "    yield from check.generator(step_events)",
    '  File "/v/dagster/_core/execution/plan/compute_generator.py", line 116, in invoke_compute',
    "    return fn(context, **args_to_pass) if context_arg_provided else fn(**args_to_pass)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "/r/rastro_assets/defs/cadence/wave.py", line 193, in sync_wave',
    "    raise dg.Failure(description=all_failed(outcomes), allow_retries=False)",
    "",
]
HANDLED_LINES = [
    f"\x1b[32m2026-12-07 01:07:22 +0000\x1b[0m - dagster - \x1b[34mERROR\x1b[0m -"
    f" meta_sync_wave - {RUN_ID} - 28215 - sync_wave - STEP_FAILURE -"
    ' Execution of step "sync_wave" failed.',
    "",
    f"dagster._core.definitions.events.Failure: {WORDS}",
    "",
    *DAGSTER_FRAMES,
    f"2026-12-07 01:07:22 +0000 - dagster - ERROR - meta_sync_wave - {RUN_ID} - 28215 -"
    ' RUN_FAILURE - Execution of run for "meta_sync_wave" failed. Steps failed: [\'sync_wave\'].',
    "",
    f"dagster._core.definitions.events.Failure: {WORDS}",
    "",
    *DAGSTER_FRAMES,
    f"2026-12-07 01:09:29 +0000 - dagster - ERROR - __ASSET_JOB - {RUN_ID} - 2841 - RUN_CANCELED"
    " - Execution of run for \"__ASSET_JOB\" canceled.",
    "",
    "dagster._core.errors.DagsterExecutionInterruptedError",
    "",
    *DAGSTER_FRAMES,
    f"2026-12-07 01:21:20 +0000 - dagster - ERROR - publish_analytics_snapshot - {RUN_ID} - 27588"
    ' - analytics_snapshot - STEP_FAILURE - Execution of step "analytics_snapshot" failed.',
    "dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred while executing op"
    ' "analytics_snapshot"::',
    "",
    "RuntimeError: Query interrupted",
    "",
    *DAGSTER_FRAMES,
]


def test_a_failure_raised_on_purpose_is_one_line_and_a_crash_keeps_its_traceback():
    kept = sift(HANDLED_LINES)
    assert kept[:2] == [
        f"\x1b[32m2026-12-07 01:07:22 +0000\x1b[0m - dagster - \x1b[34mERROR\x1b[0m -"
        f" meta_sync_wave - {RUN_ID} - 28215 - sync_wave - STEP_FAILURE -"
        f' Execution of step "sync_wave" failed: {WORDS}',
        # The run's failure repeats the step's: not said again. The interrupt's stack is
        # Dagster's alone.
        f"2026-12-07 01:09:29 +0000 - dagster - ERROR - __ASSET_JOB - {RUN_ID} - 2841 -"
        ' RUN_CANCELED - Execution of run for "__ASSET_JOB" canceled.',
    ]
    # A crash: its record, its error and its whole stack, as Dagster printed them.
    assert kept[2:] == HANDLED_LINES[-len(DAGSTER_FRAMES) - 5 :]
    assert sum('File "' in line for line in kept) == 3


def test_once_the_demo_is_stopping_each_record_is_one_line_and_nothing_else_passes():
    stopping = threading.Event()
    output = dagster_output.DagsterOutput(stopping=stopping)
    crash = HANDLED_LINES[-len(DAGSTER_FRAMES) - 5 :]
    stopping.set()
    kept = [out for line in crash for out in output.sift(line + "\n")] + output.finish()
    assert kept == [crash[0] + "\n"]
    watch_orphans = [
        "Traceback (most recent call last):",
        '  File "/v/dagster/_core/execution/scripts/watch_orphans.py", line 38, in watch',
        "    time.sleep(1)",
        "KeyboardInterrupt",
    ]
    assert [out for line in watch_orphans for out in output.sift(line + "\n")] == []


def test_a_handled_failures_words_over_several_lines_pass_once_without_the_stack():
    owing = [
        HANDLED_LINES[0].replace("meta_sync_wave", "__ASSET_JOB"),
        "",
        "dagster._core.definitions.events.Failure: 1 of this run's accounts still owe days:",
        'act_1001: META_TOKEN_INVALID: expired (docs/errors.md, "META_TOKEN_INVALID")',
        "",
        *DAGSTER_FRAMES,
        f"2026-12-07 01:07:22 +0000 - dagster - ERROR - __ASSET_JOB - {RUN_ID} - 28215 -"
        " RUN_FAILURE - Execution of run for \"__ASSET_JOB\" failed.",
        "",
        "dagster._core.definitions.events.Failure: 1 of this run's accounts still owe days:",
        'act_1001: META_TOKEN_INVALID: expired (docs/errors.md, "META_TOKEN_INVALID")',
        "",
        *DAGSTER_FRAMES,
    ]
    kept = sift(owing)
    assert kept == [
        owing[0].removesuffix(".") + ": 1 of this run's accounts still owe days:",
        owing[3],
    ]


DEV_CRASH = [
    "\x1b[32m2026-12-07 01:26:17 +0000\x1b[0m - dagster - \x1b[34mERROR\x1b[0m -"
    " \x1b[31mAn unexpected exception has occurred\x1b[0m",
    "Traceback (most recent call last):",
    '  File "/v/dagster/_cli/dev.py", line 304, in dev_command_impl',
    "    raise Exception(",
    "Exception: dagster-daemon process shut down unexpectedly with return code -9",
]


def test_a_dead_daemon_is_noted_not_printed_as_dagster_devs_traceback():
    output = dagster_output.DagsterOutput()
    assert [out for line in DEV_CRASH for out in output.sift(line + "\n")] == []
    assert output.service_died == "its dagster-daemon process exited with return code -9"
    # Any other error of `dagster dev` is passed on whole.
    other = [*DEV_CRASH[:-1], "Exception: something else"]
    output = dagster_output.DagsterOutput()
    kept = [out for line in other for out in output.sift(line + "\n")] + output.finish()
    assert kept == [line + "\n" for line in other]
    assert output.service_died is None


@pytest.mark.parametrize(
    ("extra", "argv", "threshold"),
    [
        ([], ["--log-level", "warning"], logging.WARNING),
        (["--port", "3001"], ["--port", "3001", "--log-level", "warning"], logging.WARNING),
        (["--log-level", "info"], ["--log-level", "info"], logging.INFO),
        (["--log-level=debug"], ["--log-level=debug"], logging.DEBUG),
    ],
)
def test_dagster_runs_at_the_users_log_level_else_warnings(extra, argv, threshold):
    assert dagster_output.dagster_log_level(extra) == (argv, threshold)


RELAYED = """
import sys
from rastro_assets.demo import dagster_output, dagster_process

class Quiet:
    def tick(self):
        pass

child = [sys.executable, "-c", sys.argv[1]]
sys.exit(dagster_process.supervise(child, {}, Quiet(), dagster_output.DagsterOutput()))
"""
NOISY = """
import sys
for n in range(300):
    print(f"2026-12-06 00:12:13 +0000 - dagster - DEBUG - run - STEP_START - step {n}")
print("2026-12-06 00:12:14 +0000 - dagster - WARNING - out warned")
print("2026-12-06 00:12:14 +0000 - dagster - ERROR - err failed", file=sys.stderr)
print("2026-12-06 00:12:14 +0000 - dagster - INFO - err info", file=sys.stderr)
"""


def test_supervise_passes_on_what_dagster_output_keeps_on_the_same_stream():
    result = subprocess.run(
        [sys.executable, "-c", RELAYED, NOISY], capture_output=True, text=True, timeout=60
    )
    stamp = "2026-12-06 00:12:14 +0000 - dagster"
    assert result.stdout.splitlines() == [
        f"{stamp} - WARNING - out warned",
        # Dagster stopping unasked is news.
        "rastro demo: Dagster stopped on its own (exit code 0), and the UI with it:"
        " `rastro demo` starts it again",
    ]
    assert result.stderr.splitlines() == [f"{stamp} - ERROR - err failed"]
    assert result.returncode == 1


def test_a_dagster_that_stopped_on_its_own_is_said_in_one_line():
    """`dagster dev` after its daemon was killed: it prints why with a traceback, and exits 0."""
    dies = f"import sys\nfor line in {DEV_CRASH!r}:\n    print(line, file=sys.stderr)\n"
    result = subprocess.run(
        [sys.executable, "-c", RELAYED, dies], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "rastro demo: Dagster stopped on its own (its dagster-daemon process exited with return"
        " code -9), and the UI with it: `rastro demo` starts it again"
    ]


def test_an_unchanged_progress_line_is_not_repeated_at_every_look(
    paths: DemoPaths, monkeypatch, capsys
):
    clock = Clock()
    monkeypatch.setattr(watch, "read_progress", lambda path: watch.Progress(3, 0, 90, 270))
    monkeypatch.setattr(watch, "ui_up", lambda port: False)
    watcher = watch.Watcher(paths, "3001", paths.data / "analytics.duckdb", "rastro", clock)
    for at in range(0, 200, 2):
        clock.now = at
        watcher.tick()
    line = "rastro demo: backfill: 0 of 3 accounts done, 90/270 account-days"
    # Said at once, then again once two minutes have passed: alive, and not a flood.
    assert capsys.readouterr().out.splitlines() == [line, line]


# The demo's key file ------------------------------------------------------------


def test_a_key_file_open_to_others_is_refused_and_left_as_it_is(paths: DemoPaths, now):
    demo.prepare(paths, now=now, environ={})
    key = paths.key_file.read_text()
    paths.key_file.chmod(0o644)
    with pytest.raises(SecretsKeyError, match=r"open to group or others \(mode 0644\)"):
        demo.prepare(paths, now=now, environ={})
    assert paths.key_file.read_text() == key


def test_a_symlink_planted_as_the_key_file_is_refused(paths: DemoPaths, now, tmp_path):
    planted = tmp_path / "theirs.key"
    planted.write_text(generate_key() + "\n")
    planted.chmod(0o600)
    paths.data.mkdir()
    paths.key_file.symlink_to(planted)
    with pytest.raises(SecretsKeyError, match="symbolic link"):
        demo.prepare(paths, now=now, environ={})
    assert not paths.duckdb.exists()


def test_the_demos_key_file_is_found_only_for_the_demos_warehouse(
    paths: DemoPaths, now, monkeypatch
):
    demo.prepare(paths, now=now, environ={})
    inside = paths.root / "notebooks"
    inside.mkdir()
    monkeypatch.chdir(inside)
    assert demo.demo_key_file(paths.duckdb) == paths.key_file
    assert demo.demo_key_file("../data/rastro.duckdb") == paths.key_file
    assert demo.demo_key_file(paths.data / "other.duckdb") is None
    assert demo.stray_key_files(paths.data / "other.duckdb") == [paths.key_file]
    monkeypatch.chdir(paths.root.parent)  # outside the checkout
    assert demo.demo_key_file(paths.duckdb) is None
    assert demo.stray_key_files(paths.duckdb) == [paths.key_file]
