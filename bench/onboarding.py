"""A first install, measured for real: N accounts linked at once, each
read 90 days back by a real `dagster-daemon run`, Meta at 300 ms a request.

What runs, as the product runs it:
- the fake Graph in a child process (`_world.serve_world`) on the wall clock, as the
  end-to-end tests' worlds are (a real daemon has no pinned clock, so neither has its
  Meta): N accounts of `--ads` ads (20) that all deliver every day, every answer held back
  `--delay-ms` (300);
- the accounts linked through the `rastro` command's own code, in this process: `rastro
  site add`, `rastro connect`, then the many-id `rastro link SITE ID1 ID2 ... --connection
  C`, `--link-batch` (100) ids a command (it reads Meta's `/me/adaccounts` once a command
  for each account's timezone and currency, links a batch in one transaction and adds the
  partitions to the Dagster instance); the first account alone, before them, as a process
  of its own (`rastro link SITE ID --connection C`), to say what one link costs from a shell;
- then `dagster-daemon run -w workspace.yaml` from the repo root, on the repo's
  `dagster.yaml` with only its storage moved into a temporary home (its run coordinator
  `AccountRunCoordinator`, 4 runs at once, pool `meta_api` 2), and the product's sensor
  intervals (`--sensor-seconds` shortens them). When more than 25 accounts owe their newest
  block at once, `meta_cadence` starts first-data runs (`meta_sync_wave` runs tagged
  `rastro/first_data`, each account's newest 30-day block, 100 accounts a run); `meta_accounts`
  starts one partition backfill of each shard's `spend_backfill` over the accounts owing
  days (their older blocks, or all three blocks when few are linked), which Dagster cuts into
  runs of 25 accounts, each reading its accounts side by side, block after block, newest
  first; `meta_cadence` starts live waves for the accounts already done.

Nothing waits on the wall clock for product logic: the script polls the warehouse
(`rastro_assets.demo.read_progress`, a brief read-only look that gives way to writers at
once) until every account holds its 90 days, or `--timeout-minutes`; then it lets the runs
in flight end (at most 5 minutes more) and stops the daemon.

Measured (the clock starts when the daemon starts; the links are done, and timed, before):
- each account's first data: the `finished_at` of its first ok `meta_sync_runs` row (a
  block's row is closed once its spend rows are committed), from the daemon's start; p50,
  p95, max (goal <= 5 min after its link; the links are all done before the daemon starts,
  so this is the later of the two clocks);
- the time until every account holds its 90 days: each account's last ok backfill/gap row
  in `meta_sync_runs`, for accounts with 90 days in `ad_spend_daily`; the latest of them.
  The goal depends on N: the line through the two onboarding goals (100 accounts: 12 min for
  9,000 account-days; 1,000: 20 min), 11.1 min + 0.53 s an account (`goal_all_days_minutes`);
- account-days a minute: the account-days held over that time;
- CPU: every process the daemon started (its own threads, the code server, each run's
  worker): this script is their subreaper and reaps them all, so `RUSAGE_CHILDREN` holds
  them; the fake Graph's CPU is printed apart (it is Meta's). Per account-day held; and
  Dagster's fixed share of it: (runs created x the CPU of a run with no Meta work + the
  daemon process's own CPU) / that total (goal <= 25 %). The run with no Meta work is a
  `meta_sync_wave` of no accounts, `dagster job execute` as a process of its own (what a
  run worker does), three times before the daemon starts, the median. The code server's own
  CPU (sensor ticks, launches) is printed apart and counted as work;
- runs created since the daemon started, by kind (first-data runs: tag `rastro/first_data`;
  fill runs: tag `dagster/backfill` and a `spend_backfill` asset selected; waves: tag
  `rastro/wave`, which first-data runs carry too (`meta_sync_wave`'s job tag) and are
  counted as first-data; the rest by job) and status, and their create -> start -> end times;
- Meta calls an account: the sum of `meta_sync_runs.api_calls` of the account's backfill and
  gap rows (first-data and fill runs both record kind `backfill`); the fake Graph counts its
  requests only by endpoint, in its own process, which this script cannot read;
- the backfill daemon's iterations, from the daemon's log (`Evaluating asset backfill ...`
  lines; evaluations less than a second apart are one iteration): the longest that submitted
  runs (goal <= 30 s) and those that submitted none while a backfill was requested, its runs
  in flight (goal <= 5 s, judged on the longest); the daemon process's RSS sampled every
  0.5 s (`/proc/PID/status`) and its VmHWM (all daemons are threads of that process; goal
  <= 500 MB, judged on VmHWM);
- Meta's limits: the fake Graph's limit model, printed in the header (`--tier`, and the
  load capacities and daily active users when given; the fake's defaults otherwise); the
  throttle errors met, twice: the `meta_sync_runs` rows that ended `throttled`, by error and
  by the limit that held the account (`rate_limit`, when the warehouse has that column), and
  the fake Graph's own count of the errors it answered, by code/subcode, beside its requests
  (the summary it prints when its stdin closes); and how long accounts were held: each
  throttled row's `regain_at - finished_at` (p50, max, the accounts held). A hold the product
  waits out inside a run leaves no row: the fake's count is the one that sees those;
- the load average at the start and at the end: the figures hold for a quiet machine only.

Last line: `ONBOARDING: ...` with each figure beside its goal.

Run: .venv/bin/python bench/onboarding.py [--accounts 1000] [--delay-ms 300] [--ads 20]
     [--planned-subset] [--shards K] [--shard-accounts N] [--pool-limit N] [--sensor-seconds S]
     [--link-batch 100] [--timeout-minutes 240] [--keep DIR]
     [--tier standard|development] [--app-insights-load UNITS] [--account-insights-load UNITS]
     [--daily-active-users N] [--limit-off LIMIT]
  --planned-subset  DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=true in the daemon
  --shards K        RASTRO_ACCOUNT_SHARDS=K for the links and the daemon (docs/growing.md:
                    a shard for each hundred accounts)
  --shard-accounts N  RASTRO_SHARD_ACCOUNTS=N: how many accounts `rastro link` puts in a
                    shard before the next (the README's 50 from about 1,000 accounts)
  --pool-limit N    the `meta_api` pool's limit instead of dagster.yaml's 2
  --tier T          the fake Graph's access tier (standard: Meta's "Full access", or
                    development: "Limited access"); the insights load capacities a second
                    (the app's, an account's), the daily active users behind `X-App-Usage` and
                    the limits left off set the fake's limit model further
                    (`python -m rastro_fake_graph --help` has their defaults)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import io
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

BACKFILL_DAYS = 90
FILL_KINDS = ("backfill", "gap")
GOAL_FIRST_DATA_SECONDS = 5 * 60
GOAL_FIXED_SHARE = 0.25
GOAL_ITERATION_SECONDS = 30.0
GOAL_IN_FLIGHT_SECONDS = 5.0
GOAL_DAEMON_MB = 500
LINK_BATCH = 100
PLANNED_SUBSET_VARIABLE = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
SITE = "s1"
CONNECTION = "c1"
TOKEN_VARIABLE = "RASTRO_BENCH_TOKEN"
PR_SET_CHILD_SUBREAPER = 36
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOG_LINE = re.compile(
    r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) [+-]\d{4} - dagster\.daemon\.BackfillDaemon - \w+ - "
    r"(.*)$"
)
BACKFILL_OF_RUN = re.compile(r"'dagster/backfill': '([^']+)'")


def goal_all_days_minutes(accounts: int) -> float:
    """Minutes until every account holds its 90 days: the two onboarding goals (100 accounts in
    12 min, 1,000 in 20) and the line through them for any other N, 11.1 min + 0.53 s an
    account."""
    return 12 + (accounts - 100) * (20 - 12) / (1000 - 100)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_of(pid: int) -> float:
    """utime + stime of a live process (and its waited-for children), in seconds."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        ticks = sum(int(value) for value in _stat_fields(pid)[11:15])
        return ticks / os.sysconf("SC_CLK_TCK")
    return 0.0


def own_cpu(pid: int) -> float:
    """utime + stime of a live process alone (its threads, none of its children)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        ticks = sum(int(value) for value in _stat_fields(pid)[11:13])
        return ticks / os.sysconf("SC_CLK_TCK")
    return 0.0


def status_kb(pid: int, field: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def become_subreaper() -> None:
    """Orphans of the daemon's tree come to this process, which reaps them: their CPU lands
    in RUSAGE_CHILDREN."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap(keep: set[int]) -> None:
    """Wait for every finished child except `keep` (the fake Graph)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in keep:  # pragma: no cover - the fake Graph ends after the measurement
            keep.discard(pid)


def code_servers_of(session: int) -> list[int]:
    """The code server processes of the daemon's session (`dagster api grpc` or
    `dagster code-server start`)."""
    found = []
    for pid in _descendants_of_session(session):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b" grpc" in command or b"code-server" in command:
                found.append(pid)
    return found


# -- the instance and the links -------------------------------------------------------------


def instance_config(home: Path, pool_limit: int | None = None) -> dict:
    """The repo's dagster.yaml with its storage moved into `home`, nothing else changed but
    the `meta_api` pool's limit when `pool_limit` is given."""
    import yaml

    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    if pool_limit:
        config["concurrency"]["pools"]["default_limit"] = pool_limit
    config["storage"] = {"sqlite": {"base_dir": str(home / "storage")}}
    config["local_artifact_storage"]["config"]["base_dir"] = str(home)
    config["compute_logs"]["config"]["base_dir"] = str(home / "logs")
    return config


def rastro(argv: list[str], env: dict[str, str]) -> str:
    """One `rastro` command through the CLI's own code, in this process."""
    from rastro_assets.cli import run
    from rastro_assets.cli.context import Context

    out, err = io.StringIO(), io.StringIO()
    code = run(argv, Context(environ=env, stdin=io.StringIO(""), stdout=out, stderr=err))
    if code != 0:
        shown = " ".join(argv[:4]) + (" ..." if len(argv) > 4 else "")
        raise SystemExit(f"rastro {shown} failed ({code}): {err.getvalue()}")
    return out.getvalue()


LINKS_PER_CONNECTION = 500
"""The most links one Meta connection holds (the reference's limit, `rastro link` keeps it):
an agency past it connects its Business Manager's token again under a second name."""


def connection_of(index: int) -> str:
    return f"c{index // LINKS_PER_CONNECTION + 1}"


def link_accounts(accounts: list[str], env: dict[str, str], batch: int) -> dict[str, float]:
    """`rastro site add`, a `connect` per 500 accounts, the first account's `rastro link` as a
    process of its own, then the others `batch` ids a many-id `rastro link` in this process."""
    rastro(["site", "add", SITE, "--name", "Onboarding bench"], env)
    for index in range(0, len(accounts), LINKS_PER_CONNECTION):
        rastro(["connect", connection_of(index), "--token-env", TOKEN_VARIABLE], env)
    started = time.perf_counter()
    subprocess.run(
        [str(Path(sys.executable).parent / "rastro"), "link", SITE, accounts[0],
         "--connection", CONNECTION],
        cwd=REPO, env=env, check=True, capture_output=True,
    )
    process_seconds = time.perf_counter() - started
    started, cpu = time.perf_counter(), self_cpu()
    commands = 0
    index = 1
    while index < len(accounts):
        # A command's ids share one connection.
        end = min(index + batch, (index // LINKS_PER_CONNECTION + 1) * LINKS_PER_CONNECTION)
        end = min(end, len(accounts))
        rastro(["link", SITE, *accounts[index:end], "--connection", connection_of(index)], env)
        commands += 1
        index = end
    rest = len(accounts) - 1
    many_seconds = time.perf_counter() - started
    return {
        "process_seconds": process_seconds,
        "many_seconds": many_seconds,
        "many_commands": commands,
        "many_per_account": many_seconds / max(rest, 1),
        "many_cpu_per_account": (self_cpu() - cpu) / max(rest, 1),
        "total_seconds": process_seconds + many_seconds,
    }


def empty_run_cost(env: dict[str, str], home: Path, times: int = 3) -> tuple[float, float]:
    """CPU and wall seconds of a run that does no Meta work: a wave of no accounts, executed
    as its own process (`dagster job execute`, what a run worker does). Medians."""
    config = home / "empty_wave.yaml"
    config.write_text("ops:\n  sync_wave:\n    config:\n      syncs: []\n")
    cpus, walls = [], []
    for _ in range(times):
        before, started = children_cpu(), time.perf_counter()
        subprocess.run(
            [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m",
             "rastro_assets.definitions", "-j", "meta_sync_wave", "-c", str(config)],
            cwd=REPO, env=env, check=True, capture_output=True,
        )
        walls.append(time.perf_counter() - started)
        cpus.append(children_cpu() - before)
    return statistics.median(cpus), statistics.median(walls)


# -- while the daemon runs ------------------------------------------------------------------


class RssSampler(threading.Thread):
    """The daemon process's RSS every `every` seconds: (epoch, MB)."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            kb = status_kb(self.pid, "VmRSS")
            if kb:
                self.samples.append((time.time(), kb / 1024))

    def peak_between(self, start: float, end: float) -> float:
        inside = [mb for at, mb in self.samples if start - self.every <= at <= end + self.every]
        return max(inside, default=0.0)


def wait_until_onboarded(duckdb_path: Path, accounts: int, started: float, timeout: float,
                         poll: float) -> bool:
    """Poll the warehouse (a brief read-only look that gives way to writers) until every
    account holds its 90 days; print progress every minute."""
    from rastro_assets.demo.watch import read_progress

    printed = 0.0
    while time.time() - started < timeout:
        progress = read_progress(duckdb_path)
        if progress is not None:
            if progress.accounts == accounts and progress.finished:
                return True
            if time.time() - printed >= 60:
                printed = time.time()
                print(f"  {(printed - started) / 60:5.1f} min: {progress.line()} "
                      f"(load {load()})", flush=True)
        time.sleep(poll)
    return False


def wait_for_runs_to_end(home: Path, started: float, timeout: float) -> float | None:
    """Seconds from `started` until no run is queued or in flight, or None at `timeout`."""
    import dagster as dg

    from rastro_assets.defs.keys import IN_FLIGHT_STATUSES

    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            if not instance.get_runs_count(dg.RunsFilter(statuses=IN_FLIGHT_STATUSES)):
                return time.time() - started
            time.sleep(2)
    return None


# -- afterwards -----------------------------------------------------------------------------


def warehouse_figures(duckdb_path: Path, started: float) -> dict:
    """Each account's syncs from `meta_sync_runs` and its days in `ad_spend_daily`."""
    from rastro_assets.warehouse.connection import Warehouse

    with Warehouse(duckdb_path).connect(read_only=True) as con:
        rows = con.execute(
            """
            SELECT ad_account_id,
                   min(finished_at) FILTER (WHERE outcome = 'ok'),
                   max(finished_at) FILTER (WHERE outcome = 'ok' AND kind IN ('backfill', 'gap')),
                   coalesce(sum(api_calls) FILTER (WHERE kind IN ('backfill', 'gap')), 0),
                   count(*) FILTER (WHERE kind IN ('backfill', 'gap')),
                   count(*) FILTER (WHERE kind IN ('backfill', 'gap')
                                    AND outcome IS DISTINCT FROM 'ok')
            FROM meta_sync_runs GROUP BY ALL
            """
        ).fetchall()
        errors = con.execute(
            """
            SELECT coalesce(outcome, 'open') || ': ' || coalesce(error, ''), count(*)
            FROM meta_sync_runs
            WHERE kind IN ('backfill', 'gap') AND outcome IS DISTINCT FROM 'ok'
            GROUP BY ALL ORDER BY 2 DESC LIMIT 5
            """
        ).fetchall()
        linked = dict(con.execute(
            "SELECT ad_account_id, min(linked_at) FROM site_ad_accounts GROUP BY ALL"
        ).fetchall())
        days = dict(con.execute(
            """
            SELECT s.ad_account_id, count(DISTINCT s.day)
            FROM ad_spend_daily s JOIN meta_ad_accounts m USING (ad_account_id)
            WHERE s.day > (now() AT TIME ZONE m.timezone)::DATE - ?
            GROUP BY ALL
            """,
            [BACKFILL_DAYS],
        ).fetchall())
    return {
        "first_data": {row[0]: row[1].timestamp() - started for row in rows if row[1]},
        "first_data_from_link": {
            row[0]: row[1].timestamp() - linked[row[0]].timestamp()
            for row in rows if row[1] and linked.get(row[0])
        },
        "last_fill": {row[0]: row[2].timestamp() - started for row in rows if row[2]},
        "meta_calls": {row[0]: row[3] for row in rows if row[4]},
        "fill_rows": sum(row[4] for row in rows),
        "fill_rows_not_ok": sum(row[5] for row in rows),
        "errors": errors,
        "days": days,
    }


def limit_settings(args) -> dict:
    """The fake Graph's limit settings this run chose (`_world.LIMIT_OPTIONS`)."""
    return {name: getattr(args, name) for name in _world.LIMIT_OPTIONS}


def throttle_figures(duckdb_path: Path) -> dict:
    """The syncs that ended throttled: by error and limit, and how long each held its account
    (`regain_at - finished_at`)."""
    from rastro_assets.warehouse.connection import Warehouse

    with Warehouse(duckdb_path).connect(read_only=True) as con:
        columns = {row[0] for row in con.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'meta_sync_runs'"
        ).fetchall()}
        limit = "coalesce(rate_limit, '?')" if "rate_limit" in columns else "'?'"
        by_cause = con.execute(
            f"""
            SELECT {limit}, coalesce(error, ''), count(*), count(DISTINCT ad_account_id)
            FROM meta_sync_runs WHERE outcome = 'throttled'
            GROUP BY ALL ORDER BY 3 DESC LIMIT 8
            """
        ).fetchall()
        holds = con.execute(
            """
            SELECT ad_account_id, epoch(regain_at) - epoch(finished_at)
            FROM meta_sync_runs
            WHERE outcome = 'throttled' AND regain_at IS NOT NULL AND finished_at IS NOT NULL
            """
        ).fetchall()
        syncs = con.execute("SELECT count(*) FROM meta_sync_runs").fetchone()[0]
    return {
        "by_cause": by_cause,
        "rows": sum(row[2] for row in by_cause),
        "holds": [max(0.0, float(seconds)) for _, seconds in holds],
        "accounts_held": len({account for account, _ in holds}),
        "syncs": syncs,
    }


def report_throttles(throttles: dict, summary: dict | None) -> str:
    """Print the throttle errors met and the holds; the ONBOARDING line's part of them."""
    print(f"  syncs that ended throttled: {throttles['rows']} of {throttles['syncs']} "
          f"meta_sync_runs rows")
    for limit, error, times, accounts in throttles["by_cause"]:
        print(f"    x{times} ({accounts} accounts), limit {limit}: {error[:160]}")
    holds = throttles["holds"]
    if holds:
        print(f"  accounts held (regain_at - finished_at of those rows): "
              f"{throttles['accounts_held']} accounts, p50 {percentile(holds, 0.5):.0f} s, "
              f"p95 {percentile(holds, 0.95):.0f} s, max {max(holds):.0f} s")
    refused = sum((summary or {}).get("refusals", {}).values())
    requests = sum((summary or {}).get("requests", {}).values())
    if summary is None:
        print("  the fake Graph said nothing of its requests (it did not stop cleanly)")
    else:
        codes = ", ".join(f"{code} x{times}" for code, times in sorted(
            summary["refusals"].items(), key=lambda item: -item[1])) or "none"
        print(f"  the fake Graph answered {requests} requests, {refused} of them errors "
              f"({refused / max(requests, 1):.2%}): {codes}")
        load = summary.get("app_load")
        if load:
            print(f"  the app's insights load (sampled every 0.5 s in the fake): peak "
                  f"{load['peak_units']:.0f} units a second; at or above 75 % of its capacity "
                  f"{load['seconds_at_75']:.0f} s, at 100 % {load['seconds_at_100']:.0f} s")
    held = (f"held p50 {percentile(holds, 0.5) / 60:.1f} / max {max(holds) / 60:.1f} min "
            f"({throttles['accounts_held']} accounts)" if holds else "no account held")
    errors = (f"{refused} error answers of {requests} requests" if summary is not None else
              "the fake's count unknown")
    return f"throttled syncs {throttles['rows']}, {held}; {errors}"


def run_kind(run) -> str:
    """first-data, fill, wave, another backfill's run, or the run's job."""
    from rastro_assets.defs.keys import BACKFILL_ID_TAG, FIRST_DATA_TAG, WAVE_TAG, is_fill_key

    if run.tags.get(FIRST_DATA_TAG):
        return "first-data"
    if BACKFILL_ID_TAG in run.tags:
        if any(is_fill_key(key) for key in run.asset_selection or ()):
            return "fill"
        return "other backfill"
    if run.tags.get(WAVE_TAG) == "true":
        return "wave"
    return run.job_name


def run_figures(home: Path, started: float) -> dict:
    """Dagster's run records of runs created since the daemon started."""
    import dagster as dg

    from rastro_assets.defs.keys import FIRST_DATA_TAG

    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records()
    kinds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    queue_waits: list[float] = []
    first_data_accounts = 0
    for record in records:
        if record.create_timestamp.timestamp() < started:
            continue
        run = record.dagster_run
        kind = run_kind(run)
        kinds[kind][run.status.value] += 1
        if kind == "first-data":
            first_data_accounts += int(run.tags[FIRST_DATA_TAG])
        if record.start_time is not None:
            queue_waits.append(record.start_time - record.create_timestamp.timestamp())
            if record.end_time is not None:
                seconds[kind].append(record.end_time - record.start_time)
    return {
        "kinds": kinds,
        "runs": sum(sum(counts.values()) for counts in kinds.values()),
        "run_seconds": seconds,
        "queue_waits": queue_waits,
        "first_data_accounts": first_data_accounts,
    }


def backfill_evaluations(log: Path) -> list[dict]:
    """The backfill daemon's evaluations of each backfill from its log: start, end (whole
    seconds, as the log stamps them) and the runs each submitted. The daemon evaluates the
    backfills on threads of its own, so their lines interleave: each line is given to the
    backfill it names (`Submitted run` lines by their `dagster/backfill` tag)."""
    evaluations: list[dict] = []
    going: dict[str, dict] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(ANSI.sub("", line))
        if not match:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        message = match[2]
        if message.startswith("Evaluating asset backfill"):
            backfill = message.split()[-1]
            going[backfill] = {"backfill": backfill, "start": at, "end": at, "submitted": 0}
            evaluations.append(going[backfill])
            continue
        if message.startswith("Submitted run"):
            named = BACKFILL_OF_RUN.search(message)
            item = going.get(named[1]) if named else None
            if item is not None:
                item["submitted"] += 1
                item["end"] = at
            continue
        for backfill, item in list(going.items()):
            if f" {backfill} " in f" {message} ":
                item["end"] = at
                if message.startswith(f"Asset backfill {backfill} completed"):
                    del going[backfill]
    return sorted(evaluations, key=lambda item: item["start"])


def daemon_iterations(evaluations: list[dict]) -> list[tuple[float, float, int]]:
    """Backfill evaluations merged when they overlap or follow one another within a second
    (one daemon iteration takes every backfill): (start, end, runs submitted)."""
    merged: list[list] = []
    for item in evaluations:
        if merged and item["start"] - merged[-1][1] <= 1:
            merged[-1][1] = max(merged[-1][1], item["end"])
            merged[-1][2] += item["submitted"]
        else:
            merged.append([item["start"], item["end"], item["submitted"]])
    return [tuple(window) for window in merged]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def goal(figure: float, limit: float) -> str:
    return "met" if figure <= limit else f"MISSED by {figure / limit:.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--delay-ms", type=float, default=300.0)
    parser.add_argument("--ads", type=int, default=20, help="ads of each account (all deliver)")
    parser.add_argument("--planned-subset", action="store_true",
                        help=f"{PLANNED_SUBSET_VARIABLE}=true in the daemon's environment")
    parser.add_argument("--sensor-seconds", type=int, default=0,
                        help="RASTRO_SENSOR_INTERVAL_SECONDS (default: the product's 30/60 s)")
    parser.add_argument("--pool-limit", type=int, default=0,
                        help="the meta_api pool's limit (default: dagster.yaml's, 2)")
    parser.add_argument("--shards", type=int, default=1,
                        help="RASTRO_ACCOUNT_SHARDS (default 1); `rastro link` fills each shard "
                        "to RASTRO_SHARD_ACCOUNTS (100) in turn")
    parser.add_argument("--shard-accounts", type=int, default=0,
                        help="RASTRO_SHARD_ACCOUNTS (default: the product's 100)")
    parser.add_argument("--link-batch", type=int, default=LINK_BATCH,
                        help=f"ids a many-id `rastro link` command ({LINK_BATCH})")
    parser.add_argument("--timeout-minutes", type=float, default=240.0)
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    parser.add_argument("--keep", type=Path, help="leave the warehouse, home and log in DIR")
    from rastro_fake_graph.server import add_limit_options

    add_limit_options(parser)
    args = parser.parse_args()
    if args.accounts < 1 or args.link_batch < 1:
        parser.error("--accounts and --link-batch take 1 at least")

    from rastro_assets.vault import generate_key
    from rastro_assets_tests.e2e.daemon_harness import Daemon

    cores = os.cpu_count() or 1
    accounts = [_world.wave_account(index) for index in range(args.accounts)]
    start_load = load()
    print(f"onboarding {args.accounts} accounts x {BACKFILL_DAYS} days, {args.ads} ads each, "
          f"Meta at {args.delay_ms:.0f} ms a request, planned events "
          f"{'as subsets' if args.planned_subset else 'per partition'}, {shard_layout(args)}"
          f", meta_api pool "
          f"{args.pool_limit or 'as dagster.yaml'}, {cores} cores, load {start_load}", flush=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="rastro-onboarding-"))
    root.mkdir(parents=True, exist_ok=True)
    home = root / "dagster_home"
    home.mkdir(exist_ok=True)
    import yaml

    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config(home, args.pool_limit)))
    try:
        with _world.serve_world(1, 5000, delay_ms=args.delay_ms, wave_accounts=args.accounts,
                                wave_ads=args.ads, system_clock=True,
                                limits=limit_settings(args)) as server:
            print(f"Meta's limits (the fake Graph's model): {server.limits}", flush=True)
            env = {
                **os.environ,
                "DAGSTER_HOME": str(home),
                "RASTRO_DUCKDB_PATH": str(root / "rastro.duckdb"),
                "RASTRO_ANALYTICS_PATH": str(root / "analytics.duckdb"),
                "RASTRO_META_GRAPH_URL": server.base_url,
                "RASTRO_SECRETS_KEY": generate_key(),
                TOKEN_VARIABLE: _world.TOKEN,
            }
            env.pop(PLANNED_SUBSET_VARIABLE, None)
            env["RASTRO_ACCOUNT_SHARDS"] = str(args.shards)
            if args.shard_accounts:
                env["RASTRO_SHARD_ACCOUNTS"] = str(args.shard_accounts)
            if args.sensor_seconds:
                env["RASTRO_SENSOR_INTERVAL_SECONDS"] = str(args.sensor_seconds)
            # `rastro link` adds the partitions to the instance at DAGSTER_HOME (this process).
            os.environ["DAGSTER_HOME"] = str(home)
            links = link_accounts(accounts, env, args.link_batch)
            print(f"linked {args.accounts} accounts in {links['total_seconds']:.1f} s: one "
                  f"`rastro link` of one account as a process {links['process_seconds']:.2f} s; "
                  f"the other {args.accounts - 1} in {links['many_commands']} many-id "
                  f"`rastro link` commands of <= {args.link_batch} in this process, "
                  f"{links['many_seconds']:.1f} s ({links['many_per_account']:.3f} s, "
                  f"{links['many_cpu_per_account']:.3f} CPU s an account; Meta's "
                  f"/me/adaccounts read once a command, {args.delay_ms:.0f} ms a request)",
                  flush=True)
            run_cpu, run_wall = empty_run_cost(env, home)
            print(f"a run with no Meta work (`dagster job execute`, empty wave): "
                  f"{run_cpu:.2f} CPU s, {run_wall:.1f} s wall (median of 3)", flush=True)
            if args.planned_subset:
                env[PLANNED_SUBSET_VARIABLE] = "true"

            become_subreaper()
            keep = {server.process.pid}
            reap(keep)
            cpu_before, graph_before = children_cpu(), cpu_of(server.process.pid)
            log = root / "daemon.log"
            daemon = Daemon(env, log)
            started = time.time()
            daemon.start()
            sampler = RssSampler(daemon.process.pid)
            sampler.start()
            try:
                onboarded = wait_until_onboarded(
                    root / "rastro.duckdb", args.accounts, started,
                    args.timeout_minutes * 60, args.poll_seconds,
                )
                wall = time.time() - started
                # The warehouse holds the days before the last run has recorded its events:
                # let the runs in flight end, so stopping the daemon fails none of them.
                runs_ended = wait_for_runs_to_end(home, started, 300)
                daemon_peak = status_kb(daemon.process.pid, "VmHWM") / 1024
                daemon_cpu = own_cpu(daemon.process.pid)
                code_server_cpu = sum(own_cpu(pid) for pid in code_servers_of(daemon.process.pid))
            finally:
                sampler.stopped.set()
                daemon.stop()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the run workers the group stop left
                reap(keep)
                if not any(
                    Path(f"/proc/{pid}").exists()
                    for pid in _descendants_of_session(daemon.process.pid)
                ):
                    break
                time.sleep(0.5)
            reap(keep)
            cpu = children_cpu() - cpu_before
            graph_cpu = cpu_of(server.process.pid) - graph_before
            end_load = load()
        report(args, root, home, started, wall, onboarded, Cpu(
            cpu, daemon_cpu, code_server_cpu, graph_cpu, run_cpu, run_wall, cores
        ), daemon_peak, sampler, start_load, end_load, runs_ended, server)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


class Cpu:
    """CPU seconds: everything the daemon started, the daemon's own, the code server's own,
    the fake Graph's, and a run with no Meta work (CPU and wall)."""

    def __init__(self, total: float, daemon: float, code_server: float, graph: float,
                 empty_run: float, empty_run_wall: float, cores: int) -> None:
        self.total, self.daemon, self.code_server, self.graph = total, daemon, code_server, graph
        self.empty_run, self.empty_run_wall, self.cores = empty_run, empty_run_wall, cores


def shard_layout(args) -> str:
    """The shard count, and the shard size when the run sets one."""
    layout = f"{args.shards} shard{'s' if args.shards > 1 else ''}"
    return f"{layout} of {args.shard_accounts}" if args.shard_accounts else layout


def _descendants_of_session(session: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def report(args, root: Path, home: Path, started: float, wall: float, onboarded: bool,
           cpu: Cpu, daemon_peak: float, sampler: RssSampler, start_load: str, end_load: str,
           runs_ended: float | None, server) -> None:
    n = args.accounts
    house = warehouse_figures(root / "rastro.duckdb", started)
    throttles = throttle_figures(root / "rastro.duckdb")
    runs = run_figures(home, started)
    full = [account for account, days in house["days"].items() if days >= BACKFILL_DAYS]
    held = sum(min(days, BACKFILL_DAYS) for days in house["days"].values())
    # An account is done when it holds its 90 days: its last fill sync so far says nothing
    # of an account with blocks still owed.
    done = {account: at for account, at in house["last_fill"].items() if account in full}
    all_done = max(done.values()) if len(done) == n else None
    first = list(house["first_data"].values())
    from_link = list(house["first_data_from_link"].values())
    first_max = max(first) if len(first) == n else float("inf")
    goal_minutes = goal_all_days_minutes(n)
    span = all_done if all_done is not None else wall
    per_minute = held / (span / 60) if span > 0 else 0.0
    evaluations = backfill_evaluations(root / "daemon.log")
    iterations = daemon_iterations(evaluations)
    submitting = [window for window in iterations if window[2]]
    in_flight = [end - start for start, end, submitted in iterations if not submitted]
    longest_submit = max((end - start for start, end, _ in submitting), default=0.0)
    in_flight_longest = max(in_flight, default=0.0)
    launched = runs["runs"]
    fixed = launched * cpu.empty_run + cpu.daemon
    share = fixed / cpu.total if cpu.total else 0.0
    per_day_ms = cpu.total / held * 1000 if held else float("inf")
    calls = list(house["meta_calls"].values())
    kinds = runs["kinds"]

    def count(kind: str) -> int:
        return sum(kinds.get(kind, {}).values())

    ended = f"{minutes(runs_ended)} min" if runs_ended is not None else "not within 5 min more"
    print(f"\nafter {minutes(wall)} min ({'every account onboarded' if onboarded else 'TIMED OUT'}"
          f"; every run ended after {ended}; load at the start {start_load}, at the end "
          f"{end_load})")
    when = (f"every account's 90 days in the warehouse after {minutes(all_done)} min"
            if all_done is not None else
            f"{held} of {n * BACKFILL_DAYS} account-days in the warehouse")
    print(f"  {when}; {len(full)} of {n} accounts hold 90 days in ad_spend_daily; "
          f"{per_minute:.0f} account-days a minute; backfill/gap sync rows "
          f"{house['fill_rows']} ({house['fill_rows_not_ok']} not ok)")
    for error, times in house["errors"]:
        print(f"    not ok x{times}: {error[:200]}")
    if done:
        print(f"  accounts done ({len(done)}): first {minutes(min(done.values()))} min, p50 "
              f"{minutes(percentile(list(done.values()), 0.5))} min")
    if first:
        print(f"  first data ({len(first)} of {n} accounts), from the daemon's start: p50 "
              f"{minutes(percentile(first, 0.5))}, p95 {minutes(percentile(first, 0.95))}, "
              f"max {minutes(max(first))} min; from the account's link: p50 "
              f"{minutes(percentile(from_link, 0.5))}, max {minutes(max(from_link))} min")
    for kind in sorted(kinds):
        statuses = ", ".join(f"{status} {number}" for status, number in sorted(
            kinds[kind].items()))
        durations = runs["run_seconds"].get(kind)
        timing = (f"; start -> end median {statistics.median(durations):.0f} s, longest "
                  f"{max(durations):.0f} s" if durations else "")
        print(f"  {kind} runs: {sum(kinds[kind].values())} ({statuses}){timing}")
    if runs["first_data_accounts"]:
        print(f"  first-data runs read {runs['first_data_accounts']} accounts' newest blocks")
    if runs["queue_waits"]:
        print(f"  run create -> start: median {statistics.median(runs['queue_waits']):.0f} s, "
              f"longest {max(runs['queue_waits']):.0f} s")
    if calls:
        print(f"  Meta calls an account (meta_sync_runs.api_calls of its backfill/gap rows): "
              f"mean {statistics.mean(calls):.1f}, p50 {percentile(calls, 0.5):.0f}, max "
              f"{max(calls):.0f} ({len(calls)} accounts)")
    print(f"  Meta's limits: {server.limits}")
    throttle_text = report_throttles(throttles, server.summary)
    for window_start, window_end, submitted in submitting:
        print(f"  backfill daemon submitted {submitted} runs in {window_end - window_start:.0f} s "
              f"at +{minutes(window_start - started)} min; daemon RSS peak "
              f"{sampler.peak_between(window_start, window_end):.0f} MB")
    if in_flight:
        print(f"  backfill daemon iterations that submitted nothing while a backfill was "
              f"requested: {len(in_flight)}, median {statistics.median(in_flight):.0f} s, p90 "
              f"{percentile(in_flight, 0.9):.0f} s, longest {in_flight_longest:.0f} s")
    before = sampler.peak_between(started, submitting[0][0]) if submitting else 0.0
    print(f"  daemon process (all daemons' threads): VmHWM {daemon_peak:.0f} MB; RSS before the "
          f"first submission {before:.0f} MB")
    print(f"  CPU: {cpu.total:.0f} s by the daemon and everything it started, "
          f"{per_day_ms:.1f} ms an account-day held ({held}), {cpu.total / n:.2f} s an account; "
          f"{cpu.total / wall:.2f} of {cpu.cores} cores on average; the daemon process alone "
          f"{cpu.daemon:.0f} s, the code server alone (sensor ticks, launches) "
          f"{cpu.code_server:.0f} s; the fake Graph {cpu.graph:.0f} s apart")
    print(f"  Dagster's fixed share: ({launched} runs x {cpu.empty_run:.2f} CPU s a run with no "
          f"Meta work + the daemon's {cpu.daemon:.0f} s) / {cpu.total:.0f} s = {share:.0%} "
          f"({launched * cpu.empty_run / cpu.cores / 60:.1f} min of {cpu.cores} cores for the "
          f"runs' fixed cost; {cpu.empty_run_wall:.1f} s wall a run)")
    status = "" if onboarded else " (TIMED OUT: figures so far)"
    total = (f"{minutes(all_done)} min (goal <= {goal_minutes:.0f} min at {n} accounts: "
             f"{goal(all_done, goal_minutes * 60)})" if all_done is not None else
             f"more than {minutes(wall)} min, {len(full)} of {n} done (goal <= "
             f"{goal_minutes:.0f} min at {n} accounts: MISSED)")
    first_text = (
        f"p50 {minutes(percentile(first, 0.5))} / p95 {minutes(percentile(first, 0.95))} / max "
        f"{minutes(first_max)} min" if len(first) == n else
        f"{len(first)} of {n} accounts, max so far {minutes(max(first, default=0.0))} min"
    )
    submit_text = (
        f"submitting iteration {longest_submit:.0f} s (goal <= 30 s: "
        f"{goal(longest_submit, GOAL_ITERATION_SECONDS)})" if submitting else
        "no iteration submitted runs (goal <= 30 s: not measured)"
    )
    in_flight_text = (
        f"in flight longest {in_flight_longest:.0f} s of {len(in_flight)} (goal <= 5 s: "
        f"{goal(in_flight_longest, GOAL_IN_FLIGHT_SECONDS)})" if in_flight else
        "no iteration with runs in flight (goal <= 5 s: not measured)"
    )
    print(
        f"ONBOARDING: {n} accounts in {shard_layout(args)}, Meta at {args.delay_ms:.0f} ms, "
        f"{args.tier} tier: "
        f"first data {first_text} (goal <= {GOAL_FIRST_DATA_SECONDS // 60}: "
        f"{goal(first_max, GOAL_FIRST_DATA_SECONDS)}); "
        f"every account's 90 days in {total}; {per_minute:.0f} account-days a minute; "
        f"{per_day_ms:.1f} CPU ms an account-day, Dagster's fixed share {share:.0%} (goal <= "
        f"{GOAL_FIXED_SHARE:.0%}: {goal(share, GOAL_FIXED_SHARE)}); {launched} runs "
        f"(first-data {count('first-data')}, fill {count('fill')}, waves {count('wave')}, "
        f"other {launched - count('first-data') - count('fill') - count('wave')}); Meta calls "
        f"an account p50 {percentile(calls, 0.5):.0f}, max {max(calls, default=0):.0f}; "
        f"{throttle_text}; "
        f"backfill daemon: {submit_text}, {in_flight_text}; daemon {daemon_peak:.0f} MB "
        f"(goal <= 500: {goal(daemon_peak, GOAL_DAEMON_MB)}); load {start_load} -> "
        f"{end_load}{status}"
    )


if __name__ == "__main__":
    main()
