"""A first install, measured for real (issue 25, item 3): N accounts linked at once, each
backfilled 90 days by a real `dagster-daemon run`, Meta at 300 ms a request.

What runs, as the product runs it:
- the fake Graph in a child process (`_world.serve_world`) on the wall clock, as the
  end-to-end tests' worlds are (a real daemon has no pinned clock, so neither has its
  Meta): N accounts of `--ads` ads (20) that all deliver every day, every answer held back
  `--delay-ms` (300);
- the accounts linked through the `rastro` command's own code (`rastro site add`,
  `rastro connect`, then `rastro link` for each account, which asks Meta for the account's
  timezone and currency and adds its partition to the Dagster instance), in this process;
  the first two links also as processes of their own, to say what a shell loop of
  `rastro link` costs an account;
- then `dagster-daemon run -w workspace.yaml` from the repo root, on the repo's
  `dagster.yaml` with only its storage moved into a temporary home (its run coordinator
  `AccountRunCoordinator`, the per-account tag limits, 4 runs at once, pool `meta_api` 2),
  and the product's sensor intervals (`--sensor-seconds` shortens them). `meta_accounts`
  starts the backfills, the backfill daemon submits their 30-day runs, the queue launches
  them; `meta_cadence` starts live waves for the accounts already done.

Nothing waits on the wall clock for product logic: the script polls Dagster's run records
and takes brief read-only looks at the warehouse (`rastro_assets.demo.read_progress`, which
gives way to writers at once) until every account holds its 90 days, or `--timeout-minutes`.

Measured (the clock starts when the daemon starts; the links are timed before it):
- time until every account holds its 90 days, from the warehouse: the last `finished_at` of
  the ok backfill runs in `meta_sync_runs`, and `ad_spend_daily` holding 90 days for each;
- each account's wait until its first run started (Dagster's run records, the run's
  `meta_account` tag): max and p50;
- the backfill daemon's iterations, from the daemon's log: how long each that submitted runs
  took and how many runs it submitted; the daemon process's RSS sampled every 0.5 s
  (`/proc/PID/status`) during them, and its VmHWM (all daemons are threads of that process);
  and, once every run is submitted, how long each iteration over the backfills in flight
  takes (goal <= 5 s, as `bench/scale.py` measures it for 20 new accounts);
- CPU seconds of every process the daemon started (code server, run workers): this script
  is their subreaper and reaps them all, so `RUSAGE_CHILDREN` holds them; the fake Graph's
  CPU is printed apart (it is Meta's);
- runs launched, by kind, and their create -> start -> end times;
- the floor Dagster's per-run cost sets: a run with no Meta work (a `meta_sync_wave` of no
  accounts, `dagster job execute`, three times before the daemon starts) in CPU seconds,
  x runs / cores.

Last line: `ONBOARDING: ...` with each figure beside its goal (<= 2 h, no account waiting
more than 30 min for its first run, the submitting iteration <= 30 s and <= 500 MB).

Run: .venv/bin/python bench/onboarding.py [--accounts 1000] [--delay-ms 300] [--ads 20]
     [--planned-subset] [--shards K] [--shard-accounts N] [--pool-limit N] [--sensor-seconds S]
     [--timeout-minutes 240] [--keep DIR]
  --planned-subset  DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=true in the daemon
  --shards K        RASTRO_ACCOUNT_SHARDS=K for the links and the daemon (docs/operations.md:
                    a shard for each hundred accounts)
  --shard-accounts N  RASTRO_SHARD_ACCOUNTS=N: how many accounts `rastro link` puts in a
                    shard before the next (the README's 50 from about 1,000 accounts)
  --pool-limit N    the `meta_api` pool's limit instead of dagster.yaml's 2
"""

from __future__ import annotations

import argparse
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
GOAL_TOTAL_SECONDS = 2 * 3600
GOAL_FIRST_RUN_SECONDS = 30 * 60
GOAL_ITERATION_SECONDS = 30.0
GOAL_ITERATION_MB = 500
GOAL_IN_FLIGHT_SECONDS = 5.0
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


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


def cpu_of(pid: int) -> float:
    """utime + stime of a live process (and its waited-for children), in seconds."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = sum(int(value) for value in fields[11:15])
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
        raise SystemExit(f"rastro {' '.join(argv)} failed ({code}): {err.getvalue()}")
    return out.getvalue()


def link_accounts(accounts: list[str], env: dict[str, str]) -> dict[str, float]:
    """`rastro site add`, `connect`, and a `rastro link` per account (the first two as
    processes of their own)."""
    rastro(["site", "add", SITE, "--name", "Onboarding bench"], env)
    rastro(["connect", CONNECTION, "--token-env", TOKEN_VARIABLE], env)
    as_processes = accounts[:2]
    started = time.perf_counter()
    for account in as_processes:
        subprocess.run(
            [str(Path(sys.executable).parent / "rastro"), "link", SITE, account,
             "--connection", CONNECTION],
            cwd=REPO, env=env, check=True, capture_output=True,
        )
    process_seconds = (time.perf_counter() - started) / max(len(as_processes), 1)
    started, cpu = time.perf_counter(), self_cpu()
    for account in accounts[len(as_processes):]:
        rastro(["link", SITE, account, "--connection", CONNECTION], env)
    rest = max(len(accounts) - len(as_processes), 1)
    return {
        "process_seconds": process_seconds,
        "in_process_seconds": (time.perf_counter() - started) / rest,
        "in_process_cpu": (self_cpu() - cpu) / rest,
        "total_seconds": time.perf_counter() - started + process_seconds * len(as_processes),
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
    account's first backfill is done; print progress every minute."""
    from rastro_assets.demo import read_progress

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

    in_flight = [
        dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
    ]
    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            if not instance.get_runs_count(dg.RunsFilter(statuses=in_flight)):
                return time.time() - started
            time.sleep(2)
    return None


# -- afterwards -----------------------------------------------------------------------------


def warehouse_figures(duckdb_path: Path, started: float) -> dict:
    """Each account's backfill from `meta_sync_runs` and its days in `ad_spend_daily`."""
    from rastro_assets.warehouse.connection import Warehouse

    with Warehouse(duckdb_path).connect(read_only=True) as con:
        backfills = con.execute(
            """
            SELECT ad_account_id, count(*), min(started_at), max(finished_at),
                   count(*) FILTER (WHERE outcome <> 'ok')
            FROM meta_sync_runs WHERE kind = 'backfill' GROUP BY ALL
            """
        ).fetchall()
        days = dict(con.execute(
            """
            SELECT s.ad_account_id, count(DISTINCT s.day)
            FROM ad_spend_daily s JOIN meta_ad_accounts m USING (ad_account_id)
            WHERE s.day > (now() AT TIME ZONE m.timezone)::DATE - ?
            GROUP BY ALL
            """,
            [BACKFILL_DAYS],
        ).fetchall())
    done = {row[0]: row[3].timestamp() - started for row in backfills if row[3] is not None}
    return {
        "backfill_runs": sum(row[1] for row in backfills),
        "failed_backfill_runs": sum(row[4] for row in backfills),
        "done_seconds": done,
        "days": days,
    }


def run_figures(home: Path, started: float) -> dict:
    """Dagster's run records of runs created since the daemon started."""
    import dagster as dg

    from rastro_assets.defs.keys import ACCOUNT_TAG, SYNC_KIND_TAG

    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records()
    kinds: dict[str, int] = {}
    first_start: dict[str, float] = {}
    durations, queue_waits = [], []
    for record in records:
        if record.create_timestamp.timestamp() < started:
            continue
        run = record.dagster_run
        kind = run.tags.get(SYNC_KIND_TAG) or run.job_name
        kinds[f"{kind} {run.status.value}"] = kinds.get(f"{kind} {run.status.value}", 0) + 1
        account = run.tags.get(ACCOUNT_TAG)
        if record.start_time is not None:
            queue_waits.append(record.start_time - record.create_timestamp.timestamp())
            if record.end_time is not None:
                durations.append(record.end_time - record.start_time)
            if account and run.tags.get(SYNC_KIND_TAG) == "backfill":
                first_start[account] = min(first_start.get(account, 1e20), record.start_time)
    return {
        "kinds": kinds,
        "runs": sum(kinds.values()),
        "first_start": {account: at - started for account, at in first_start.items()},
        "run_seconds": durations,
        "queue_waits": queue_waits,
    }


def backfill_iterations(log: Path) -> list[dict]:
    """The backfill daemon's evaluations of each backfill from its log: start, end (whole
    seconds, as the log stamps them) and the runs each submitted."""
    iterations: list[dict] = []
    current: dict | None = None
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(ANSI.sub("", line))
        if not match:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        message = match[2]
        if message.startswith("Evaluating asset backfill"):
            current = {"backfill": message.split()[-1], "start": at, "end": at, "submitted": 0}
            iterations.append(current)
        elif current is not None:
            current["end"] = at
            if message.startswith("Submitted run"):
                current["submitted"] += 1
    return iterations


def daemon_iterations(evaluations: list[dict]) -> list[tuple[float, float, int]]:
    """Backfill evaluations merged when they follow one another within a second (the daemon
    takes the backfills one after another in one iteration): (start, end, runs submitted)."""
    merged: list[list] = []
    for item in evaluations:
        if merged and item["start"] - merged[-1][1] <= 1:
            merged[-1][1] = item["end"]
            merged[-1][2] += item["submitted"]
        else:
            merged.append([item["start"], item["end"], item["submitted"]])
    return [tuple(window) for window in merged]


def submitting_windows(iterations: list[dict]) -> list[tuple[float, float, int]]:
    """Daemon iterations that submitted runs: (start, end, runs)."""
    return daemon_iterations([item for item in iterations if item["submitted"]])


def in_flight_iterations(iterations: list[dict]) -> list[float]:
    """How long each daemon iteration took after the last run was submitted, in seconds."""
    last_submission = max((item["end"] for item in iterations if item["submitted"]),
                          default=None)
    if last_submission is None:
        return []
    after = [item for item in iterations if item["start"] > last_submission]
    return [end - start for start, end, _ in daemon_iterations(after)]


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
    parser.add_argument("--timeout-minutes", type=float, default=240.0)
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    parser.add_argument("--keep", type=Path, help="leave the warehouse, home and log in DIR")
    args = parser.parse_args()

    from rastro_assets.vault import generate_key
    from rastro_assets_tests.e2e.daemon_harness import Daemon

    cores = os.cpu_count() or 1
    accounts = [_world.wave_account(index) for index in range(args.accounts)]
    print(f"onboarding {args.accounts} accounts x {BACKFILL_DAYS} days, {args.ads} ads each, "
          f"Meta at {args.delay_ms:.0f} ms a request, planned events "
          f"{'as subsets' if args.planned_subset else 'per partition'}, {shard_layout(args)}"
          f", meta_api pool "
          f"{args.pool_limit or 'as dagster.yaml'}, {cores} cores, load {load()}", flush=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="rastro-onboarding-"))
    root.mkdir(parents=True, exist_ok=True)
    home = root / "dagster_home"
    home.mkdir(exist_ok=True)
    import yaml

    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config(home, args.pool_limit)))
    try:
        with _world.serve_world(1, 5000, delay_ms=args.delay_ms, wave_accounts=args.accounts,
                                wave_ads=args.ads, system_clock=True) as server:
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
            # `rastro link` adds the partition to the instance at DAGSTER_HOME (this process).
            os.environ["DAGSTER_HOME"] = str(home)
            links = link_accounts(accounts, env)
            print(f"linked {args.accounts} accounts in {links['total_seconds']:.0f} s: "
                  f"`rastro link` as a process {links['process_seconds']:.2f} s an account, "
                  f"in process {links['in_process_seconds']:.3f} s "
                  f"({links['in_process_cpu']:.3f} CPU s; one Meta request at "
                  f"{args.delay_ms:.0f} ms)", flush=True)
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
        report(args, root, home, started, wall, onboarded, cpu, graph_cpu, daemon_peak,
               sampler, run_cpu, run_wall, cores, end_load, runs_ended)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


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


def report(args, root: Path, home: Path, started: float, wall: float, onboarded: bool,
           cpu: float, graph_cpu: float, daemon_peak: float, sampler: RssSampler,
           run_cpu: float, run_wall: float, cores: int, end_load: str,
           runs_ended: float | None) -> None:
    n = args.accounts
    house = warehouse_figures(root / "rastro.duckdb", started)
    runs = run_figures(home, started)
    full = [account for account, days in house["days"].items() if days >= BACKFILL_DAYS]
    # An account is done when it holds its 90 days: its last backfill sync so far says
    # nothing of an account with blocks still queued.
    done = {account: at for account, at in house["done_seconds"].items() if account in full}
    all_done = max(done.values(), default=float("nan"))
    held = sum(min(days, BACKFILL_DAYS) for days in house["days"].values())
    waits = list(runs["first_start"].values())
    iterations = backfill_iterations(root / "daemon.log")
    windows = submitting_windows(iterations)
    ended = f"{runs_ended / 60:.1f} min" if runs_ended is not None else "not within 5 min more"
    print(f"\nafter {wall / 60:.1f} min ({'every account onboarded' if onboarded else 'TIMED OUT'}"
          f"; every run ended after {ended}; load at the end {end_load})")
    when = (f"every account's 90 days in the warehouse after {all_done / 60:.1f} min"
            if len(full) == n else f"{held} of {n * BACKFILL_DAYS} account-days in the warehouse")
    print(f"  {when}; {len(full)} of {n} accounts hold 90 days in "
          f"ad_spend_daily; backfill sync runs {house['backfill_runs']} "
          f"({house['failed_backfill_runs']} not ok)")
    if done:
        print(f"  accounts done ({len(done)}): p50 "
              f"{percentile(list(done.values()), 0.5) / 60:.1f} min, "
              f"first {min(done.values()) / 60:.1f} min")
    print(f"  wait until an account's first run started: max {max(waits, default=0) / 60:.1f} "
          f"min, p50 {percentile(waits, 0.5) / 60:.1f} min ({len(waits)} accounts)")
    kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(runs["kinds"].items()))
    print(f"  Dagster runs: {runs['runs']} ({kinds})")
    if runs["run_seconds"]:
        print(f"  run start -> end: median {statistics.median(runs['run_seconds']):.1f} s, "
              f"p90 {percentile(runs['run_seconds'], 0.9):.1f} s; create -> start: median "
              f"{statistics.median(runs['queue_waits']) / 60:.1f} min, max "
              f"{max(runs['queue_waits']) / 60:.1f} min")
    for window_start, window_end, submitted in windows:
        print(f"  backfill daemon submitted {submitted} runs in {window_end - window_start:.0f} s "
              f"({window_end - window_start:.0f} s / {submitted} = "
              f"{(window_end - window_start) / submitted:.2f} s a run) at "
              f"+{(window_start - started) / 60:.1f} min; daemon RSS peak "
              f"{sampler.peak_between(window_start, window_end):.0f} MB")
    per_backfill = [item for item in iterations if item["submitted"]]
    if per_backfill:
        print(f"  backfills that submitted runs: {len(per_backfill)}, "
              f"{sum(item['submitted'] for item in per_backfill)} runs, longest "
              f"{max(item['end'] - item['start'] for item in per_backfill):.0f} s")
    in_flight = in_flight_iterations(iterations)
    if in_flight:
        print(f"  backfill daemon iterations with the runs in flight (after the last submission): "
              f"{len(in_flight)}, median {statistics.median(in_flight):.0f} s, p90 "
              f"{percentile(in_flight, 0.9):.0f} s, longest {max(in_flight):.0f} s (goal <= 5 s: "
              f"{goal(statistics.median(in_flight), GOAL_IN_FLIGHT_SECONDS)} at the median)")
    longest = max((end - start for start, end, _ in windows), default=0.0)
    window_peak = max((sampler.peak_between(s, e) for s, e, _ in windows), default=0.0)
    before = sampler.peak_between(started, windows[0][0]) if windows else 0.0
    print(f"  daemon process (all daemons' threads): VmHWM {daemon_peak:.0f} MB; RSS before the "
          f"first submission {before:.0f} MB")
    launched = runs["runs"]
    ended_runs = sum(count for kind, count in runs["kinds"].items()
                     if kind.endswith(("SUCCESS", "FAILURE", "CANCELED")))
    floor = launched * run_cpu / cores
    print(f"  CPU: {cpu:.0f} s by the daemon and everything it started "
          f"({cpu / max(ended_runs, 1):.2f} s a run that ended, of {ended_runs}; "
          f"{cpu / n:.2f} s an account); "
          f"the fake Graph {graph_cpu:.0f} s apart; {cpu / wall:.2f} of {cores} cores on average")
    print(f"  floor Dagster's per-run cost sets: {launched} runs x {run_cpu:.2f} CPU s (a run "
          f"with no Meta work) / {cores} cores = {floor / 60:.1f} min "
          f"({floor / n:.2f} s an account; {run_wall:.1f} s wall a run)")
    status = "" if onboarded else " (TIMED OUT: figures so far)"
    total = (
        f"{all_done / 60:.1f} min (goal <= 120 min: {goal(all_done, GOAL_TOTAL_SECONDS)}"
        if onboarded else
        f"more than {wall / 60:.0f} min: {len(full)} of {n} done (goal <= 120 min: not known"
    )
    print(
        f"ONBOARDING: {n} accounts in {shard_layout(args)}"
        f" x 90 days in {total}; floor {floor / 60:.1f} min); "
        f"{len(waits)} of {n} accounts had a first run, after "
        f"<= {max(waits, default=0) / 60:.1f} min, p50 {percentile(waits, 0.5) / 60:.1f} min "
        f"(goal <= 30: {goal(max(waits, default=0), GOAL_FIRST_RUN_SECONDS)}); submitting "
        f"iteration {longest:.0f} s (goal <= 30 s: {goal(longest, GOAL_ITERATION_SECONDS)}), "
        f"{window_peak:.0f} MB (goal <= 500: {goal(window_peak, GOAL_ITERATION_MB)}); "
        f"{launched} runs, {cpu:.0f} CPU s{status}"
    )


if __name__ == "__main__":
    main()
