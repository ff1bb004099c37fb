"""Incidents (alerts layer): which conditions need a person now, grouped by cause: a dead
token is one incident for every account it pauses, not one per account.

Pure: it reads the planner's view of each account (`PlannedAccount`) and what the caller
found elsewhere (the snapshot's publish state, Dagster's runs and ticks), and opens nothing
by itself. The daemon's incident sensor stores what it finds (`alerts.ledger`); `rastro
status --check` asks the same questions of the warehouse directly.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from rastro_assets.alerts.quoted import quoted
from rastro_assets.meta.limits import RateLimit, describe
from rastro_assets.outcomes import FILL_KINDS, AccountHealth, Outcome
from rastro_assets.planner import cadence
from rastro_assets.planner.backoff import Failure, Hold, read_history
from rastro_assets.planner.history import PlannedAccount
from rastro_assets.planner.instants import local_time, span, utc, utc_or_none, utc_run
from rastro_assets.settings import AlertThresholds

RUNBOOK = "docs/errors.md"
MAX_NAMED = 20
"""Accounts named in one incident's text; the rest are counted."""


class IncidentKind(StrEnum):
    TOKEN = "token"
    STALE = "stale"
    STUCK = "stuck"
    PERMISSION = "permission"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    SNAPSHOT = "snapshot"
    RUN_FAILURES = "run_failures"
    SENSOR = "sensor"
    DAEMON = "daemon"
    CHANNELS = "channels"
    SETTINGS = "settings"
    UNRECORDED = "unrecorded"


# What only the daemon sees (Dagster's runs and ticks, the values its code location loaded
# with); `rastro status --check` takes these from the stored incidents instead of finding
# them itself.
DAEMON_KINDS = frozenset({IncidentKind.RUN_FAILURES, IncidentKind.SENSOR, IncidentKind.SETTINGS})


@dataclass(frozen=True)
class Incident:
    """One cause that needs a person, with what to do about it.

    `key` names the cause (a kind and what it is about: a connection, a job): the same cause
    found again is the same incident, so it is said once, not at every check.
    """

    key: str
    kind: IncidentKind
    summary: str
    """One line: what is wrong and how much of the product it touches."""
    detail: str = ""
    """The accounts and errors behind it, a line each."""
    fix: str = ""
    """What to do, with the exact command where there is one."""
    since: datetime | None = None
    """When the condition began, when known."""
    accounts: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "kind": str(self.kind),
            "summary": self.summary,
            "detail": self.detail,
            "fix": self.fix,
            "since": None if self.since is None else self.since.isoformat(),
            "accounts": list(self.accounts),
        }


def account_incidents(
    accounts: Sequence[PlannedAccount],
    now: datetime,
    thresholds: AlertThresholds,
    *,
    connection_errors: dict[str, tuple[str | None, datetime | None]] | None = None,
) -> list[Incident]:
    """The incidents of the linked accounts at `now`, one per cause and connection.

    `connection_errors` gives each invalid connection's stored error and since when it is
    invalid (`meta_connections.invalid_since`); without it the accounts' view is used.
    """
    now = utc(now)
    by_cause: dict[tuple[IncidentKind, str], list[_Found]] = {}
    for account in accounts:
        found = _account_cause(account, now, thresholds)
        if found is not None:
            by_cause.setdefault((found.kind, account.connection_id), []).append(found)
    errors = connection_errors or {}
    incidents = [
        _BUILDERS[kind](connection, found, errors.get(connection), now)
        for (kind, connection), found in by_cause.items()
    ]
    return sorted(incidents, key=lambda incident: incident.key)


def snapshot_incident(
    owed: bool,
    published_at: datetime | None,
    waiting_since: datetime | None,
    path: str,
    now: datetime,
    thresholds: AlertThresholds,
) -> Incident | None:
    """The snapshot has owed a change for longer than allowed.

    `waiting_since` is when the oldest change it owes was made, when known (the first sync
    since the last publish, or the first link when there was none): a change made a minute
    ago by a run that publishes at its end is not late, however long the warehouse was
    quiet before it.
    """
    since = utc_or_none(waiting_since) or utc_or_none(published_at)
    if not owed or since is None or utc(now) - since < thresholds.snapshot:
        return None
    last = (
        "never published"
        if published_at is None
        else f"last published {span(utc(now) - utc(published_at))} ago"
    )
    return Incident(
        key=IncidentKind.SNAPSHOT.value,
        kind=IncidentKind.SNAPSHOT,
        summary=(
            f"the analytics snapshot is behind the warehouse by {span(utc(now) - since)}: {last}"
        ),
        detail=f"snapshot: {quoted(path)}",
        fix=(
            "look at the latest analytics_snapshot run's failure in the Dagster UI; "
            '`rastro publish` publishes it by hand (docs/analysts.md, "The analytics snapshot")'
        ),
        since=since,
    )


def run_failures_incident(
    job: str, failures: int, latest_error: str, since: datetime | None, thresholds: AlertThresholds
) -> Incident | None:
    """`failures` runs of `job` failed in a row, none succeeding in between."""
    if failures < thresholds.run_failures:
        return None
    return Incident(
        key=f"{IncidentKind.RUN_FAILURES.value}:{job}",
        kind=IncidentKind.RUN_FAILURES,
        summary=f"the last {failures} runs of {job} failed",
        detail=f"latest failure: {quoted(latest_error)}" if latest_error else "",
        fix=(
            f"open the latest failed run of {job} in the Dagster UI (Runs, filtered by job); "
            f"its error code is explained in {RUNBOOK}, \"Error codes\""
        ),
        since=since,
    )


def sensor_start_command(name: str, home: str | None) -> str:
    """The shell command that turns sensor `name` on, run from the checkout (where
    workspace.yaml is) with the daemon's Dagster home."""
    where = f"DAGSTER_HOME={shlex.quote(home)} " if home else "DAGSTER_HOME=<the daemon's> "
    return f"{where}dagster sensor start {name} -w workspace.yaml"


def sensor_incident(
    name: str,
    last_tick: datetime | None,
    stopped: bool,
    now: datetime,
    thresholds: AlertThresholds,
    *,
    home: str | None = None,
) -> Incident | None:
    """A cadence sensor turned off, or silent for longer than allowed. `home` is the
    daemon's DAGSTER_HOME, which the command that turns it on needs."""
    if stopped:
        summary = f"the sensor {name} is stopped: nothing it starts runs"
        fix = (
            f"turn {name} on in the Dagster UI (Automation), or from the checkout: "
            f"`{sensor_start_command(name, home)}`"
        )
    elif last_tick is not None and utc(now) - utc(last_tick) >= thresholds.sensor:
        summary = f"the sensor {name} has not ticked for {span(utc(now) - utc(last_tick))}"
        fix = (
            "look at the daemon's log (`journalctl -u rastro-daemon`, or the terminal of "
            "`rastro daemon`) and restart the daemon"
        )
    else:
        return None
    return Incident(
        key=f"{IncidentKind.SENSOR.value}:{name}",
        kind=IncidentKind.SENSOR,
        summary=summary,
        fix=fix,
        since=last_tick,
    )


def daemon_incident(
    last_check: datetime | None, now: datetime, thresholds: AlertThresholds
) -> Incident | None:
    """The daemon's incident sensor, which checked before, has not checked for too long:
    the daemon is down, or its sensors are."""
    if last_check is None or utc(now) - utc(last_check) < thresholds.sensor:
        return None
    return Incident(
        key=IncidentKind.DAEMON.value,
        kind=IncidentKind.DAEMON,
        summary=(
            f"the daemon's checks stopped {span(utc(now) - utc(last_check))} ago: no sync "
            "runs and no alert is sent while it is down"
        ),
        fix="start or restart the daemon: `sudo systemctl restart rastro-daemon` where it is a "
        "service, else `rastro daemon -w workspace.yaml` from the checkout with its "
        'DAGSTER_HOME (docs/running.md, "Running the daemon and the webserver as services")',
        since=last_check,
    )


def channels_incident(problem: str | None) -> Incident | None:
    """The alert channels' settings are unusable: no notice is sent at all."""
    if problem is None:
        return None
    return Incident(
        key=IncidentKind.CHANNELS.value,
        kind=IncidentKind.CHANNELS,
        summary=f"no alert can be sent: {problem}",
        fix=f"correct the variable in the daemon's environment and restart it ({RUNBOOK}, "
        '"Alerts")',
    )


def settings_incident(refusals: Sequence[str]) -> Incident | None:
    """Values the code location refused when it loaded, each read as its default instead."""
    if not refusals:
        return None
    return Incident(
        key=IncidentKind.SETTINGS.value,
        kind=IncidentKind.SETTINGS,
        summary=f"the code location refused {len(refusals)} setting"
        f"{'' if len(refusals) == 1 else 's'} and reads the default instead: {'; '.join(refusals)}",
        fix="correct the variable in the environment of the daemon and the code location and"
        ' restart them (docs/running.md, "Settings")',
    )


# --- per account ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    account: PlannedAccount
    kind: IncidentKind
    since: datetime
    why: str
    limit: str | None = None
    """The Meta limit behind a rate-limit hold, when named."""
    retry_at: datetime | None = None
    """When a rate-limited account is tried again."""


def _account_cause(
    account: PlannedAccount, now: datetime, thresholds: AlertThresholds
) -> _Found | None:
    """The one cause an account counts toward: the first that holds of a dead token, a lost
    permission, a long throttle, Meta failing every try, a stuck backfill, stale data."""
    state = account.state
    status = cadence.status(state, now)
    runs = sorted((utc_run(run) for run in state.runs), key=lambda run: run.started_at)
    history = read_history(runs, now)
    if status.state == AccountHealth.PAUSED:
        return _Found(account, IncidentKind.TOKEN, now, _said(status.last_error))
    last = history.failures[-1] if history.failures else None
    if last is not None and last.outcome == Outcome.PERMISSION:
        return _Found(account, IncidentKind.PERMISSION, last.run.started_at, _said(last.error))
    if last is not None and last.outcome == Outcome.THROTTLED:
        throttled = [failure for failure in history.failures if failure.outcome == last.outcome]
        first = throttled[0].run.started_at
        # Abuse prevention cut the account's quota: hours of waiting a person should know
        # of now, not after the threshold.
        if last.run.rate_limit == RateLimit.ABUSE or now - first >= thresholds.rate_limited:
            retry_at = max(utc_or_none(status.next_sync_at) or now, now)
            held = _held(last.run.rate_limit, status.rate_limit, retry_at, state.timezone, now)
            return _Found(
                account, IncidentKind.RATE_LIMITED, first, f"{held}; {_said(last.error)}",
                last.run.rate_limit, retry_at,
            )
    if last is not None and last.outcome == Outcome.OTHER:
        # Meta failed the sync through the client's own retries (timeouts, 5xx, "retry
        # later"): the account's data stops here, and the back-off makes that long.
        first = _streak(history.failures, Outcome.OTHER)
        return _Found(account, IncidentKind.UNAVAILABLE, first, _said(last.error))
    # Nothing is owed from before the link, nor from before a new token was connected.
    sealed = utc_or_none(state.token_sealed_at)
    baseline = max(utc(state.linked_at), sealed) if sealed else utc(state.linked_at)
    if status.backfill is not None:
        moved = max(
            (
                run.finished_at
                for run in history.ok_runs
                if run.kind in FILL_KINDS and run.finished_at is not None
            ),
            default=None,
        )
        since = max(baseline, moved) if moved is not None else baseline
        if now - since >= thresholds.stuck:
            done, total = status.backfill
            why = f"{done} of {total} days read" + (
                f"; {quoted(status.last_error)}" if status.last_error else ""
            )
            return _Found(account, IncidentKind.STUCK, since, why)
        return None
    synced = cadence.today_synced_at(state)
    since = max(baseline, synced) if synced is not None else baseline
    idle_extra = cadence.freshness_limit(state, now) - cadence.FRESHNESS_LIMIT
    if now - since >= thresholds.stale + idle_extra:
        read = "today never read" if synced is None else f"today last read {span(now - synced)} ago"
        why = read + (f"; {quoted(status.last_error)}" if status.last_error else "")
        return _Found(account, IncidentKind.STALE, since, why)
    return None


def _held(
    limit: str | None, held: Hold | None, retry_at: datetime, timezone: str, now: datetime
) -> str:
    """When the account is tried again (`rastro status`'s next sync) and which limit holds
    it till then, as its line in the incident says it: in its own zone and in UTC."""
    if retry_at <= now:
        return f"retried now; refused last by {_limit_named(limit)}"
    when = f"retried at {local_time(retry_at, timezone)} ({retry_at:%H:%M} UTC)"
    if held is None:
        # The limit's hold ended before the cadence's next read: that read is the retry.
        return f"{when}, its next read; refused last by {_limit_named(limit)}"
    return f"{when}, held till then by {_limit_named(held.limit)}"


def _limit_named(limit: str | None) -> str:
    """A limit as a person reads it, with the name `rastro status` shows."""
    return describe(limit) + (f" ({limit})" if limit else "")


def _streak(failures: Sequence[Failure], outcome: str) -> datetime:
    """When the latest run of failures ending so, in a row, began."""
    first = failures[-1].run.started_at
    for failure in reversed(failures):
        if failure.outcome != outcome:
            break
        first = failure.run.started_at
    return first


def _next_try(found: Sequence[_Found]) -> str:
    """The earliest retry of a rate-limit incident's accounts, for its summary line."""
    retries = [each.retry_at for each in found if each.retry_at is not None]
    if not retries:
        return ""
    return f"; next try at {utc(min(retries)):%H:%M} UTC"


def _limits(found: Sequence[_Found]) -> str:
    """The limits behind a rate-limit incident's accounts, named once each."""
    names = sorted({each.limit or "unnamed" for each in found})
    return ", ".join(names)


def _said(error: str | None) -> str:
    """An account's stored error (Meta's words, mostly) as the reason beside it."""
    return quoted(error) if error else ""


def _named(found: Sequence[_Found]) -> tuple[str, tuple[str, ...]]:
    """The accounts, one line each with its sites and why, the first `MAX_NAMED` of them."""
    ordered = sorted(found, key=lambda each: each.account.state.ad_account_id)
    lines = [
        f"{each.account.state.ad_account_id} (sites {', '.join(each.account.sites)}): {each.why}"
        for each in ordered[:MAX_NAMED]
    ]
    if len(ordered) > MAX_NAMED:
        lines.append(f"and {len(ordered) - MAX_NAMED} more accounts")
    return "\n".join(lines), tuple(each.account.state.ad_account_id for each in ordered)


def _sites(found: Iterable[_Found]) -> str:
    counts: dict[str, int] = {}
    for each in found:
        for site in each.account.sites:
            counts[site] = counts.get(site, 0) + 1
    if len(counts) == 1:
        return f"site {next(iter(counts))}"
    return "sites " + ", ".join(
        f"{site} ({_accounts(count)})" for site, count in sorted(counts.items())
    )


def _accounts(count: int) -> str:
    return f"{count} account{'s' if count != 1 else ''}"


def _token(connection: str, found: list[_Found], stored: object, _now: datetime) -> Incident:
    error, invalid_since = stored if isinstance(stored, tuple) else (None, None)
    detail, accounts = _named(found)
    return Incident(
        key=f"{IncidentKind.TOKEN.value}:{connection}",
        kind=IncidentKind.TOKEN,
        summary=(
            f"connection {connection}'s token is invalid: it pauses {_accounts(len(found))} "
            f"of {_sites(found)}"
        ),
        detail=(f"Meta said: {quoted(error)}\n" if error else "") + detail,
        fix=(
            f"reconnect it with a new token: `rastro connect {connection}` (reads the token "
            f"from stdin); its accounts resume at once ({RUNBOOK}, \"META_TOKEN_INVALID\")"
        ),
        since=utc_or_none(invalid_since),
        accounts=accounts,
    )


_Builder = Callable[[str, list["_Found"], object, datetime], Incident]


def _grouped(
    kind: IncidentKind, summary: Callable[[str, list[_Found], datetime], str], fix: str
) -> _Builder:
    def build(connection: str, found: list[_Found], _stored: object, now: datetime) -> Incident:
        detail, accounts = _named(found)
        return Incident(
            key=f"{kind.value}:{connection}",
            kind=kind,
            summary=summary(connection, found, now),
            detail=detail,
            fix=fix,
            since=min(each.since for each in found),
            accounts=accounts,
        )

    return build


_BUILDERS: dict[IncidentKind, _Builder] = {
    IncidentKind.TOKEN: _token,
    IncidentKind.PERMISSION: _grouped(
        IncidentKind.PERMISSION,
        lambda connection, found, now: (
            f"{_accounts(len(found))} of connection {connection} lost permission at Meta "
            f"({_sites(found)})"
        ),
        "give the connection's Meta user access to the ad account again (Business settings), "
        "then `rastro sync-now AD_ACCOUNT_ID` reads it at once (else it is retried 6 hours "
        "after the refusal); or `rastro unlink SITE_ID AD_ACCOUNT_ID` if it is gone for good "
        f"({RUNBOOK}, \"META_PERMISSION\")",
    ),
    IncidentKind.RATE_LIMITED: _grouped(
        IncidentKind.RATE_LIMITED,
        lambda connection, found, now: (
            f"{_accounts(len(found))} of connection {connection} refused by Meta's rate "
            f"limits ({_limits(found)}) for {span(now - min(each.since for each in found))}, "
            f"every try{_next_try(found)}"
        ),
        "each waits out Meta's limit and is retried on its own, when its line says; "
        "`rastro sync-now AD_ACCOUNT_ID` retries one at once (refused again while the limit "
        f'lasts). If it lasts for hours, see {RUNBOOK}, "RATE_LIMITED"',
    ),
    IncidentKind.UNAVAILABLE: _grouped(
        IncidentKind.UNAVAILABLE,
        lambda connection, found, now: (
            f"{_accounts(len(found))} of connection {connection} could not be read: Meta "
            "timed out or failed every try since "
            f"{utc(min(each.since for each in found)):%H:%M} UTC ({_sites(found)})"
        ),
        "each is retried on its own, 15 minutes after its failure and doubling; "
        "`rastro sync-now AD_ACCOUNT_ID` retries one at once. If it lasts, check Meta's "
        "platform status, this machine's network and proxy, and RASTRO_META_GRAPH_URL "
        f"({RUNBOOK}, \"META_UNAVAILABLE\")",
    ),
    IncidentKind.STUCK: _grouped(
        IncidentKind.STUCK,
        lambda connection, found, now: (
            f"the backfill{'' if len(found) == 1 else 's'} of {_accounts(len(found))} of "
            f"connection {connection} {'has' if len(found) == 1 else 'have'} not "
            f"moved for {span(now - min(each.since for each in found))}"
        ),
        "each account's reason is beside it; `rastro status` shows their progress and "
        'next try (docs/cadence.md, "The cadence")',
    ),
    IncidentKind.STALE: _grouped(
        IncidentKind.STALE,
        lambda connection, found, now: (
            f"{_accounts(len(found))} of connection {connection} "
            f"{'is' if len(found) == 1 else 'are'} stale: today's spend "
            "not read for too long"
        ),
        "each account's reason is beside it; `rastro status` shows its last and next sync, "
        f"and `rastro sync-now AD_ACCOUNT_ID` asks for one ({RUNBOOK}, \"Error codes\")",
    ),
}
