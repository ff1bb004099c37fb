"""Incidents (definitions layer): `meta_incidents`, the daemon's look, and who hears of it.

Each tick finds the incidents (`alerts.incidents`): from the warehouse, each connection's
dead token, lost permissions, long throttles, Meta failing every try, stuck backfills and
stale accounts, and the snapshot left behind; from Dagster, jobs whose runs keep failing
and cadence sensors that stopped or keep failing; and the settings the code location
refused as it loaded. The
ledger stores them, owes each channel a notice of each change (`alerts.ledger`), and the
tick then delivers what is due. The `no_open_incidents` check on `meta_account_health`
names what is open, and which channel is failing.

Fill runs are left out of the runs counted: one fails whenever an account of it is
throttled or paused, which its accounts' own incidents say better, and a backfill that
waits out Meta's budget is healthy. So are waves that failed only because each of their
accounts did: one trouble is one incident.
"""

import json
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

import dagster as dg

from rastro_assets.alerts import incidents as found
from rastro_assets.alerts.channels import Channel, channels_from_env
from rastro_assets.alerts.incidents import DAEMON_KINDS, Incident, IncidentKind
from rastro_assets.alerts.ledger import deliver, reconcile
from rastro_assets.alerts.look import warehouse_incidents
from rastro_assets.alerts.quoted import quoted
from rastro_assets.defs.cadence.sensors import ACCOUNTS_SENSOR_SECONDS, CADENCE_SENSOR_SECONDS
from rastro_assets.defs.dagster_private import AssetCheckEvaluationTargetMaterializationData
from rastro_assets.defs.keys import (
    META_ACCOUNT_HEALTH,
    NO_OPEN_INCIDENTS,
    SENSOR_LOCK_WAIT_SECONDS,
    is_fill_key,
)
from rastro_assets.defs.resources import RastroResource
from rastro_assets.settings import (
    AlertThresholds,
    SettingsError,
    load_time,
    load_time_refusals,
)
from rastro_assets.warehouse import incidents as store
from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked

INCIDENTS_SENSOR = "meta_incidents"
INCIDENTS_SENSOR_SECONDS = load_time().sensor_interval_override_seconds or 60
CADENCE_SENSORS = ("meta_accounts", "meta_cadence")
RUNS_LOOKED_AT = 300
RUNS_WINDOW = timedelta(days=1)
CURSOR_KEY = "no_open_incidents as last reported"


def _origin() -> str:
    return socket.gethostname()


# --- what Dagster shows ------------------------------------------------------------------


def run_failure_incidents(
    instance: dg.DagsterInstance, now: datetime, thresholds: AlertThresholds
) -> list[Incident]:
    """Jobs whose latest finished runs failed, `run_failures` or more in a row."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE],
            updated_after=now - RUNS_WINDOW,
        ),
        limit=RUNS_LOOKED_AT,
    )
    streaks: dict[str, list[dg.RunRecord]] = {}
    ended: set[str] = set()
    for record in records:  # newest first
        label = _job_label(record.dagster_run)
        if label is None or label in ended:
            continue
        if record.dagster_run.status == dg.DagsterRunStatus.SUCCESS:
            ended.add(label)
            continue
        if label == WAVE_JOB and _accounts_said(instance, record.dagster_run.run_id):
            continue
        streaks.setdefault(label, []).append(record)
    incidents = []
    for label, failed in sorted(streaks.items()):
        if len(failed) < thresholds.run_failures:
            continue
        first = failed[-1]
        since = datetime.fromtimestamp(first.create_timestamp.timestamp(), UTC)
        incident = found.run_failures_incident(
            label, len(failed), _failure_line(instance, failed[0].dagster_run.run_id), since,
            thresholds,
        )
        if incident is not None:
            incidents.append(incident)
    return incidents


WAVE_JOB = "meta_sync_wave"
WAVE_ALL_FAILED = "every account of the wave failed"
"""How a wave's failure begins when each of its accounts failed its own sync."""
UNSAID_CODES = ("SECRETS_KEY_MISSING",)
"""Account failures no account incident says at once: a wave failing on these still counts."""


def _accounts_said(instance: dg.DagsterInstance, run_id: str) -> bool:
    """The wave failed only because each of its accounts did: their own incidents (a dead
    token, a lost permission, Meta failing, a long throttle) say that, once per cause,
    where a streak of failed waves would say it a second time."""
    line = _failure_line(instance, run_id)
    return line.startswith(WAVE_ALL_FAILED) and not any(code in line for code in UNSAID_CODES)


def _job_label(run: dg.DagsterRun) -> str | None:
    """The name runs are counted under: the job, or an asset job's assets; None for fills."""
    if not run.job_name.startswith("__ASSET_JOB"):
        return run.job_name
    keys = sorted(key.to_user_string() for key in run.asset_selection or ())
    if any(is_fill_key(dg.AssetKey.from_user_string(key)) for key in keys) or not keys:
        return None
    shown = ", ".join(keys[:2]) + (f" and {len(keys) - 2} more" if len(keys) > 2 else "")
    return f"materializations of {shown}"


def _failure_line(instance: dg.DagsterInstance, run_id: str) -> str:
    """The first line of what made the run fail: its step's own error, under Dagster's
    wrapper ("Error occurred while executing op ..."), else the run's failure."""
    for event_type in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE):
        records = instance.get_records_for_run(run_id, of_type=event_type, limit=1).records
        for record in records:
            event = record.event_log_entry.dagster_event
            data = getattr(event, "event_specific_data", None) if event else None
            error = getattr(data, "error", None)
            while error is not None and error.cause is not None:
                error = error.cause
            message = error.message if error is not None else record.event_log_entry.message
            line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
            if line:
                return _EXCEPTION_PREFIX.sub("", line)[:300]
    return ""


# "RuntimeError: " or "dagster._core.definitions.events.Failure: " before the message itself.
_EXCEPTION_PREFIX = re.compile(r"^[\w.]*(?:Error|Exception|Failure): ")


def sensor_incidents(
    instance: dg.DagsterInstance,
    now: datetime,
    thresholds: AlertThresholds,
    *,
    settled: bool = True,
) -> list[Incident]:
    """The cadence sensors stopped in the UI, silent, or failing tick after tick.

    Unless `settled` (the daemon has run past its start's grace), only the stopped ones:
    a silence or failures from before the daemon's start are the daemon's own downtime,
    and each sensor ticks again within its interval once the daemon is up.
    """
    incidents = []
    home = _home(instance)
    states = [
        state
        for state in instance.all_instigator_state()
        if state.instigator_name in CADENCE_SENSORS and state.instigator_type.value == "SENSOR"
    ]
    for name in CADENCE_SENSORS:
        mine = [state for state in states if state.instigator_name == name]
        if not mine:
            continue  # never ticked here: nothing to tell
        state = mine[0]
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=20)
        stopped = state.status.value == "STOPPED"
        good = [tick for tick in ticks if tick.status.value in ("SUCCESS", "SKIPPED")]
        last_good = datetime.fromtimestamp(good[0].timestamp, UTC) if good else None
        last_tick = datetime.fromtimestamp(ticks[0].timestamp, UTC) if ticks else None
        if not settled:
            last_tick = None
        incident = found.sensor_incident(name, last_tick, stopped, now, thresholds, home=home)
        if incident is None and settled and ticks and ticks[0].status.value == "FAILURE":
            since = last_good or datetime.fromtimestamp(ticks[-1].timestamp, UTC)
            if now - since >= thresholds.sensor:
                error = ticks[0].error.message.strip().splitlines()[0] if ticks[0].error else ""
                incident = Incident(
                    key=f"{IncidentKind.SENSOR.value}:{name}",
                    kind=IncidentKind.SENSOR,
                    summary=f"the sensor {name} fails at every tick",
                    detail=f"latest error: {quoted(error)}" if error else "",
                    fix=f"open {name} in the Dagster UI (Automation) for the tick's error",
                    since=since,
                )
        if incident is not None:
            incidents.append(incident)
    return incidents


def _home(instance: dg.DagsterInstance) -> str | None:
    """The instance's directory, the DAGSTER_HOME a command run by hand needs."""
    try:
        return instance.root_directory
    except Exception:  # noqa: BLE001 - an instance without one: the fix says where to look
        return None


# --- the daemon's start --------------------------------------------------------------------

RESTART_GAP = timedelta(seconds=2 * INCIDENTS_SENSOR_SECONDS + 30)
"""A pause in this sensor's checks longer than this is the daemon's downtime (or the sensor's,
turned off): the next check is taken as the daemon's start. Two intervals and the daemon's
loop and a slow tick's slack."""
START_GRACE = timedelta(seconds=2 * max(ACCOUNTS_SENSOR_SECONDS, CADENCE_SENSOR_SECONDS) + 15)
"""How long after the daemon's start the cadence sensors' silence is not judged: each ticks
within its interval once the daemon is up (its code server is up by this sensor's first
check), a tick counting from its start."""
UP_SINCE_KEY = "checking since"


def up_since(last_check: datetime | None, cursor: dict, now: datetime) -> datetime:
    """Since when this sensor has checked without a pause: the daemon's start, as the
    incidents see it. `last_check` is the previous check's instant (`alert_checks`)."""
    kept = cursor.get(UP_SINCE_KEY)
    if kept is None or last_check is None or now - last_check > RESTART_GAP:
        return now
    return datetime.fromisoformat(kept)


def _cursor(text: str | None) -> dict:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) and CURSOR_KEY in value else {}


# --- the tick -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Look:
    """What one check found, and which kinds it could look at."""

    incidents: list[Incident]
    checked: set[str]
    notes: list[str]
    up_since: datetime
    """Since when the daemon has checked without a pause (its start, as far as it shows)."""


def look(
    rastro: RastroResource, instance: dg.DagsterInstance, now: datetime,
    thresholds: AlertThresholds, channel_problem: str | None, cursor: dict | None = None,
) -> Look:
    warehouse = rastro.warehouse()
    warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
    publisher = rastro.publisher()
    with warehouse.connect(read_only=True) as con:
        incidents, _ = warehouse_incidents(con, publisher, now, thresholds)
        last_check = store.last_check(con, store.DAEMON_CHECKER)
    since = up_since(last_check, cursor or {}, now)
    settled = now - since >= START_GRACE
    incidents += [item for item in [found.channels_incident(channel_problem)] if item]
    refused = found.settings_incident(list(load_time_refusals().values()))
    incidents += [refused] if refused else []
    checked = {kind.value for kind in IncidentKind if kind not in DAEMON_KINDS}
    checked.add(IncidentKind.SETTINGS.value)
    # The daemon's own silence is the probe's to see, never the daemon's.
    checked.discard(IncidentKind.DAEMON.value)
    notes = []
    for kind, finder in (
        (IncidentKind.RUN_FAILURES, run_failure_incidents),
        (IncidentKind.SENSOR, partial(sensor_incidents, settled=settled)),
    ):
        try:
            incidents += finder(instance, now, thresholds)
        except Exception as exc:  # Dagster's storage unreadable: that kind stays as it was
            notes.append(f"could not read {kind.value} from Dagster: {type(exc).__name__}")
            continue
        # Within the start's grace a sensor's silence is not looked at: one already open
        # stays as it was, neither said again nor resolved by a look that could not tell.
        if kind != IncidentKind.SENSOR or settled:
            checked.add(kind.value)
    return Look(incidents, checked, notes, since)


def configured_channels() -> tuple[list[Channel], str | None]:
    """The channels of the environment, or none and why (never a secret)."""
    try:
        return channels_from_env(), None
    except SettingsError as exc:
        return [], str(exc)


def check_evaluation(
    open_incidents: Sequence[store.StoredIncident],
    troubles: Sequence[store.ChannelTrouble],
    labels: dict[str, str],
    channel_problem: str | None,
    target: dg.EventLogRecord | None,
) -> dg.AssetCheckEvaluation:
    """`no_open_incidents`: each open incident with what to do, and how the channels fare."""
    # By key, as `rastro status --check` names them: two connections' dead tokens are two
    # incidents of one kind. What to do is in the line itself, where the UI shows it.
    lines = [f"{incident.key}: {incident.summary}. {incident.fix}" for incident in open_incidents]
    channels = channel_status(troubles, labels, channel_problem)
    description = (
        f"{len(lines)} open. " + " | ".join(lines) if lines else "no open incidents"
    ) + f". Alerts: {channels}"
    return dg.AssetCheckEvaluation(
        asset_key=META_ACCOUNT_HEALTH,
        check_name=NO_OPEN_INCIDENTS,
        passed=not lines,
        severity=dg.AssetCheckSeverity.ERROR if lines else dg.AssetCheckSeverity.WARN,
        description=description[:2000],
        target_materialization_data=target
        and AssetCheckEvaluationTargetMaterializationData(
            storage_id=target.storage_id, run_id=target.run_id, timestamp=target.timestamp
        ),
        metadata={
            "open_incidents": len(lines),
            "incidents": _incident_table(open_incidents),
            "channel_status": dg.MetadataValue.text(channels),
        },
    )


def channel_status(
    troubles: Sequence[store.ChannelTrouble], labels: dict[str, str], problem: str | None
) -> str:
    """Where notices go, and which channel refuses them; never a URL."""
    if problem:
        return f"none is sent: {problem}"
    if not labels:
        return (
            "no channel is set (RASTRO_ALERT_WEBHOOK_URLS, RASTRO_ALERT_SMTP_URL): incidents "
            "show here and in `rastro status --check` only"
        )
    failing = [
        f"{labels.get(t.channel_id, 'a removed channel')}: {t.waiting} "
        f"notice{'' if t.waiting == 1 else 's'} not delivered "
        f"since {t.failing_since:%Y-%m-%d %H:%M} UTC ({t.last_error})"
        for t in troubles
    ]
    if failing:
        return "; ".join(failing)
    return f"every notice delivered to {', '.join(sorted(labels.values()))}"


INCIDENT_COLUMNS = [
    dg.TableColumn("incident", "string"),
    dg.TableColumn("since", "string", description="when it opened, UTC"),
    dg.TableColumn("what", "string"),
    dg.TableColumn("do", "string", description="what to do"),
]


def _incident_table(open_incidents: Sequence[store.StoredIncident]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "incident": incident.key,
                    "since": f"{incident.opened_at:%m-%d %H:%M}",
                    "what": incident.summary,
                    "do": incident.fix,
                }
            )
            for incident in open_incidents
        ],
        schema=dg.TableSchema(columns=INCIDENT_COLUMNS),
    )


def _latest_health(instance: dg.DagsterInstance) -> dg.EventLogRecord | None:
    records = instance.get_asset_records([META_ACCOUNT_HEALTH])
    return records[0].asset_entry.last_materialization_record if records else None


def _incidents_tick(context: dg.SensorEvaluationContext, rastro: RastroResource):
    now = rastro.clock()()
    if not rastro.warehouse().exists():
        return dg.SkipReason("no warehouse yet: nothing is linked")
    thresholds = AlertThresholds.from_env()
    channels, channel_problem = configured_channels()
    labels = {channel.channel_id: channel.label for channel in channels}
    cursor = _cursor(context.cursor)
    try:
        seen = look(rastro, context.instance, now, thresholds, channel_problem, cursor)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    for note in seen.notes:
        context.log.warning(note)
    if channel_problem:
        context.log.error(f"no alert is sent: {channel_problem}")
    warehouse = rastro.warehouse()
    warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
    try:
        with warehouse.connect() as con:
            transitions = reconcile(
                con, seen.incidents, seen.checked, list(labels), now, thresholds.remind,
                _origin(),
                # Settings that cannot be read say nothing of which channels are gone.
                forget_other_channels=channel_problem is None,
            )
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    _log_transitions(context, transitions, quiet=not labels and channel_problem is None)
    _log_deliveries(context, deliver(warehouse.connect, channels, now))
    return _report(context, warehouse, labels, channel_problem, cursor, seen.up_since)


def _log_transitions(
    context: dg.SensorEvaluationContext, transitions: Sequence, *, quiet: bool
) -> None:
    """Each incident opened, reminded or resolved; and, when no channel is set (`quiet`),
    that no one is told but the UI and the check."""
    for transition in transitions:
        incident = transition.incident
        line = f"{transition.event} {incident.key}: {incident.summary}"
        context.log.info(line if transition.event == "resolved" else f"{line}. {incident.fix}")
    if transitions and quiet:
        context.log.warning(
            "no alert channel is set (RASTRO_ALERT_WEBHOOK_URLS, RASTRO_ALERT_SMTP_URL): "
            "these incidents show in the UI and in `rastro status --check` only"
        )


def _log_deliveries(context: dg.SensorEvaluationContext, attempts: Iterable) -> None:
    for attempt in attempts:
        if attempt.error is None:
            context.log.info(f"sent to {attempt.channel}: {attempt.subject}")
        elif attempt.retry_at is not None:
            context.log.warning(
                f"{attempt.error}; trying again at {attempt.retry_at:%H:%M:%S} UTC"
            )
        else:
            context.log.error(f"{attempt.error}; given up after a day of tries")


def _report(
    context: dg.SensorEvaluationContext,
    warehouse: Warehouse,
    labels: dict[str, str],
    channel_problem: str | None,
    cursor: dict,
    since: datetime,
) -> dg.SensorResult:
    """The check's evaluation when what is open, the channels set or their troubles changed
    since the last one reported, and the tick's summary line."""
    with warehouse.connect(read_only=True) as con:
        open_now = store.open_incidents(con)
        troubles = store.channel_troubles(con)
    latest = _latest_health(context.instance)
    reported = {
        "open": [incident.key for incident in open_now],
        "troubles": [[t.channel_id, t.last_error] for t in troubles],
        "problem": channel_problem,
        # The channels as set now: the check says where notices go.
        "channels": sorted(labels.values()),
        "health": latest.storage_id if latest else 0,
    }
    kept = json.dumps({CURSOR_KEY: reported, UP_SINCE_KEY: since.isoformat()})
    if cursor.get(CURSOR_KEY) == reported:
        return dg.SensorResult(skip_reason=_summary(open_now), cursor=kept)
    return dg.SensorResult(
        asset_events=[check_evaluation(open_now, troubles, labels, channel_problem, latest)],
        skip_reason=_summary(open_now),
        cursor=kept,
    )


def _summary(open_now: Sequence[store.StoredIncident]) -> str:
    if not open_now:
        return "no open incidents"
    count = len(open_now)
    shown = ", ".join(i.key for i in open_now[:10]) + (" and more" if count > 10 else "")
    return f"{count} open incident{'' if count == 1 else 's'}: {shown}"


def _open_incidents_evaluation(rastro: RastroResource) -> dg.AssetCheckResult:
    channels, channel_problem = configured_channels()
    with rastro.warehouse().connect(read_only=True) as con:
        open_now = store.open_incidents(con)
        troubles = store.channel_troubles(con)
    evaluation = check_evaluation(
        open_now, troubles, {c.channel_id: c.label for c in channels}, channel_problem, None
    )
    return dg.AssetCheckResult(
        passed=evaluation.passed,
        severity=evaluation.severity,
        description=evaluation.description,
        metadata=evaluation.metadata,
    )


def build_meta_incidents_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name=INCIDENTS_SENSOR,
        minimum_interval_seconds=INCIDENTS_SENSOR_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Finds what needs a person (a dead token, stale or stuck accounts, lost "
        "permissions, long throttles, Meta failing every try, the snapshot left behind, runs "
        "failing in a row, cadence sensors stopped), stores each incident once, and sends its "
        "notices to the channels of "
        "RASTRO_ALERT_WEBHOOK_URLS and RASTRO_ALERT_SMTP_URL: opened, reminded, resolved. The "
        "no_open_incidents check on meta_account_health names what is open.",
    )
    def meta_incidents_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return _incidents_tick(context, rastro)

    return meta_incidents_sensor


def build_no_open_incidents() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=META_ACCOUNT_HEALTH,
        name=NO_OPEN_INCIDENTS,
        description="Fails while an incident is open (a dead token, stale or stuck accounts, "
        "lost permissions, long throttles, Meta failing every try, the snapshot left behind, "
        "failing runs or stopped sensors), naming each with what to do, and says where alerts go "
        "and which channel "
        "fails. The meta_incidents sensor (Automation) evaluates it whenever that changes, so "
        "its own Automation history stays empty; Execute reads the incidents it last stored. "
        "A failure here turns meta_account_health red: its materialization is fine, the "
        "incidents are what need a person (docs/errors.md, \"Alerts\").",
    )
    def no_open_incidents(context: dg.AssetCheckExecutionContext, rastro: RastroResource):
        return _open_incidents_evaluation(rastro)

    return no_open_incidents


def location_defs(shard_count: int) -> dg.Definitions:
    return dg.Definitions(
        sensors=[build_meta_incidents_sensor()], asset_checks=[build_no_open_incidents()]
    )
