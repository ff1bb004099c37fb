"""The run queue, told which account each partition run writes.

Dagster gives every run of a backfill the backfill's tags and nothing per run
but its range (`dagster/asset_partition_range_start`/`_end`, values like
`act_1|2026-11-01`): no tag whose value is the account alone. The instance's
limit of one run per `meta_account` value (`dagster.yaml`) then holds a shared
backfill's runs to one at a time. This coordinator, named in `dagster.yaml`,
sets `meta_account` on each run it queues from the one account its partition or
range covers, before the queue ever sees it: an account's 30-day runs still
follow one another, and different accounts' runs go side by side. A range over
several accounts (a rectangle picked in the UI) keeps the tag it came with.

A range run that also carries per-dimension partition tags (`dagster/partition/account`,
`.../date`) is refused: Dagster's job backfills (the backfill dialog on a
`meta_spend*_sync` job's page) give every range run the tags of one partition, and a run
reads its partitions from those tags first, so it would sync that one account-day, often
of another account, and record only it. The asset's own page launches a correct backfill.

It also ranks each such run by how far back its range ends (`dagster/priority`, higher
first; ties in the order queued): the 30 days up to today come first (priority 0, as
every other run but the cadence's), the 30 before them -1, and so on. A first install of
many accounts queues every account's three runs at once, one account after another; ranked,
each account's newest days start before any account's older ones, so no account waits
behind the others' whole backfills for its first run (bench/onboarding.py). The cadence's
own runs, its waves and first-data runs, go before all of them (`CADENCE_PRIORITY`): a
backfill's runs are queued all at once, and a live wave queued behind a backfill of every
partition would wait for hundreds of them. The same rank orders the `meta_api` pool's slots.

A spend run whose range ends on a day not begun in the zone of one of its accounts (the date
axis ends on today in UTC+14) is held queued until that day begins there:
`defs/cadence/held.py` says how, and `meta_cadence` releases it. The accounts' zones are
read briefly, read-only, from the warehouse, only for a range ending on a day not begun
somewhere on Earth; when they cannot be read the run goes as any other, and reads and
records only the days begun.

Loaded, it also takes group and other permissions off the directories that hold the
instance's local files (its root, SQLite storage and compute logs). Dagster creates them
and everything in them with the process umask, and an operator may start `dagster dev` or
`dagster-daemon` under a loose one: with the directories closed, no other local user
reaches a run log or a spend event beneath them, whatever mode that file got and whichever
process made it. Not a umask set here: Dagster builds an instance's coordinator on first
use (the daemon's queue, a run submitted from the UI), which a run worker never makes, and
the run workers of `dagster dev` are children of its code server: a umask set here would
miss the run logs, yet change the mode of every later file of any process that embeds an
instance.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import suppress
from datetime import date
from pathlib import Path

import dagster as dg

from rastro_assets.defs.cadence.busy import run_accounts
from rastro_assets.defs.cadence.held import (
    HELD,
    HOLD_TAG,
    RELEASED,
    begun_everywhere,
    held_message,
    hold_tags,
)
from rastro_assets.defs.dagster_private import coordinator_logger, plugin_instance
from rastro_assets.defs.keys import (
    ACCOUNT_DIMENSION_TAG,
    ACCOUNT_TAG,
    FIRST_DATA_TAG,
    MAX_DAYS_PER_RUN,
    PRIORITY_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    WAVE_TAG,
)
from rastro_assets.defs.resources import RastroResource
from rastro_assets.instance.daemon_logs import summarise_backfill_logs
from rastro_assets.timekeeping import Clock, system_clock, zone
from rastro_assets.warehouse import registry

DIMENSION_TAG_PREFIX = "dagster/partition/"
DATE_DIMENSION_TAG = f"{DIMENSION_TAG_PREFIX}date"
TIMEZONE_WAIT_SECONDS = 5.0
"""How long the queue waits for the warehouse to read an account's zone before it lets the run
go unheld."""
CADENCE_PRIORITY = 1
"""The rank of the cadence's waves and first-data runs in the queue: above every other run."""


def run_account(tags) -> str | None:
    """The one account a run's spend partitions cover, or None (several, or none)."""
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if start and end:
        first, last = start.split("|", 1)[0], end.split("|", 1)[0]
        return first if first == last and "|" in start else None
    return tags.get(ACCOUNT_DIMENSION_TAG)


def stray_partition(tags) -> str | None:
    """The one partition a range run would read instead of its range, or None.

    Dagster takes a run's partition from its `dagster/partition/<dimension>` tags
    before its range tags; a job backfill gives every range run the first partition's.
    """
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    dimensions = {
        key[len(DIMENSION_TAG_PREFIX) :]: value
        for key, value in tags.items()
        if key.startswith(DIMENSION_TAG_PREFIX)
    }
    if not (start and end and dimensions):
        return None
    key = "|".join(value for _, value in sorted(dimensions.items()))
    return None if start == end == key else key


def range_priority(tags, today: date) -> int | None:
    """Minus the number of whole 30-day blocks between the end of a one-account range run
    and `today`: 0 for the newest days, -1 for the 30 before, ...; None for other runs."""
    end = tags.get(RANGE_END_TAG)
    if not run_account(tags) or not end:
        return None
    try:
        last = date.fromisoformat(end.split("|", 1)[1])
    except (IndexError, ValueError):
        return None
    return -(max((today - last).days, 0) // MAX_DAYS_PER_RUN)


def last_day(tags) -> date | None:
    """The last day a run's spend partitions cover (its range's end, else its one partition's
    date), or None."""
    end = tags.get(RANGE_END_TAG)
    text = end.split("|", 1)[1] if end and "|" in end else None
    if not end:
        text = tags.get(DATE_DIMENSION_TAG)
    try:
        return date.fromisoformat(text) if text else None
    except ValueError:
        return None


def account_zones(accounts: Iterable[str], log: logging.Logger) -> dict[str, str]:
    """The zone of each of `accounts` a site links, from the warehouse of the process's
    environment; none when the warehouse cannot be read now (said in the process's log)."""
    zones = {}
    try:
        warehouse = RastroResource().warehouse()
        if not warehouse.exists():
            return {}
        warehouse.lock_wait_seconds = TIMEZONE_WAIT_SECONDS
        with warehouse.connect(read_only=True) as con:
            for account in sorted(accounts):
                linked = registry.get_account(con, account)
                if linked is not None:
                    zones[account] = zone(linked.timezone).key
    except Exception as exc:  # the run is not refused for it: it records only the days begun
        log.warning(f"the accounts' zones could not be read, so the run is not held: {exc}")
        return {}
    return zones


def local_directories(instance: dg.DagsterInstance) -> Iterator[Path]:
    """The directories the instance keeps local files in: its root, and each configured
    `base_dir` (SQLite storage, compute logs), relative ones from the working directory
    as Dagster resolves them."""
    yield Path(instance.root_directory)
    if not instance.is_persistent:
        return
    ref = instance.get_ref()
    for data in (
        ref.storage_data,
        ref.run_storage_data,
        ref.event_storage_data,
        ref.schedule_storage_data,
        ref.compute_logs_data,
    ):
        base_dir = (data.config_dict or {}).get("base_dir") if data else None
        if isinstance(base_dir, str):
            yield Path(base_dir)


def close_to_others(directories: Iterable[Path]) -> None:
    """Take group and other permissions off each directory this user owns; skip the rest.

    A directory not made yet, read-only (a mounted ConfigMap) or another user's is left as
    it is: this is a second line behind the service's own umask, never a reason to fail."""
    for directory in directories:
        with suppress(OSError):
            status = directory.stat()
            mode = stat.S_IMODE(status.st_mode)
            if stat.S_ISDIR(status.st_mode) and status.st_uid == os.geteuid() and mode & 0o077:
                os.chmod(directory, mode & ~0o077)


class AccountRunCoordinator(dg.QueuedRunCoordinator):
    """`QueuedRunCoordinator` that tags each partition run with its one account."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The daemon builds its instance's coordinator: the one hook there for its log.
        summarise_backfill_logs()
        self.clock: Clock = system_clock

    def register_instance(self, instance: dg.DagsterInstance) -> None:
        super().register_instance(instance)
        close_to_others(local_directories(instance))

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        instance = plugin_instance(self)
        stray = stray_partition(run.tags)
        if stray:
            instance.report_run_failed(
                run,
                f"Refused: this run of {run.tags[RANGE_START_TAG]} .. {run.tags[RANGE_END_TAG]}"
                f" carries the partition tags of {stray}, so Dagster would sync only {stray}."
                " A backfill launched from a job's page does that; launch it from the spend"
                " asset's page (Materialize...) instead.",
            )
            return instance.get_run_by_id(run.run_id) or run
        account = run_account(run.tags)
        tags = {}
        if account and run.tags.get(ACCOUNT_TAG) != account:
            tags[ACCOUNT_TAG] = account
        hold = self._day_hold(run.tags)
        if hold:
            tags.update(hold)
        elif run.tags.get(HOLD_TAG) == HELD:  # a copy of a held run's tags: a re-execution
            tags[HOLD_TAG] = RELEASED
        priority = range_priority(run.tags, self.clock().date())
        if run.tags.get(WAVE_TAG) == "true" or run.tags.get(FIRST_DATA_TAG):
            priority = CADENCE_PRIORITY
        if priority is not None and PRIORITY_TAG not in run.tags:
            tags[PRIORITY_TAG] = str(priority)
        if tags:
            instance.add_run_tags(run.run_id, tags)
            run = instance.get_run_by_id(run.run_id) or run
            context = dg.SubmitRunContext(run, context.workspace)
        if hold:
            instance.report_engine_event(held_message(hold), run)
        return super().submit_run(context)

    def _day_hold(self, tags) -> dict[str, str] | None:
        """The tags that hold a spend run until the last day of its range has begun in the zone
        of each of its accounts; None for any other run."""
        day = last_day(tags)
        now = self.clock()
        if day is None or begun_everywhere(day, now):
            return None
        zones = account_zones(run_accounts(plugin_instance(self), tags), coordinator_logger(self))
        return hold_tags(day, zones, now)
