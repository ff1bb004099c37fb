"""`meta_incidents` end to end on real parts: a DuckDB file, a Dagster instance, real syncs
against the loopback fake Graph, and a real webhook receiver and SMTP server on loopback.

The clock is pinned: each tick and each sync runs at an instant the test names, so back-off
and thresholds are crossed by moving that instant, never by sleeping.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dagster as dg
import duckdb
import pytest

from rastro_assets.alerts.channels import EMAIL_TO_VAR, SMTP_URL_VAR, WEBHOOK_URLS_VAR
from rastro_assets.defs.cadence.incidents import INCIDENTS_SENSOR, build_meta_incidents_sensor
from rastro_assets.defs.keys import NO_OPEN_INCIDENTS, RANGE_END_TAG, RANGE_START_TAG
from rastro_assets.defs.spend.fill import build_spend_fill
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.settings import MAX_ALERT_MINUTES
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.alerts.receivers import (
    SMTP_PASSWORD,
    SMTP_PASSWORD_IN_URL,
    SMTP_USER,
    WEBHOOK_SECRET_PATH,
    SmtpReceiver,
    WebhookReceiver,
    smtp_receiver,
    webhook_receiver,
)
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.defs.waves import live, run_wave

meta_incidents_sensor = build_meta_incidents_sensor()

NEW_TOKEN = "EAAnewTOKENr5Jw27KxQm8VtYp03"
RECIPIENT = "ops@rastro.test"
REPOSITORY = "__repository__"
WEBHOOK_LABEL = "webhook 1 (127.0.0.1)"
THRESHOLD_VARS = (
    "RASTRO_ALERT_STALE_MINUTES",
    "RASTRO_ALERT_STUCK_MINUTES",
    "RASTRO_ALERT_RATE_LIMITED_MINUTES",
    "RASTRO_ALERT_SNAPSHOT_MINUTES",
    "RASTRO_ALERT_RUN_FAILURES",
    "RASTRO_ALERT_SENSOR_MINUTES",
    "RASTRO_ALERT_REMIND_MINUTES",
)


def minutes(count: float) -> datetime:
    return NOW + timedelta(minutes=count)


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as receiver:
        yield receiver


@pytest.fixture
def smtp() -> Iterator[SmtpReceiver]:
    with smtp_receiver(user=SMTP_USER, password=SMTP_PASSWORD) as receiver:
        yield receiver


@pytest.fixture
def alerting(monkeypatch, hook: WebhookReceiver, smtp: SmtpReceiver, caplog) -> None:
    """Both channels configured, every threshold but the snapshot's at its default."""
    monkeypatch.setenv(WEBHOOK_URLS_VAR, hook.url)
    monkeypatch.setenv(SMTP_URL_VAR, smtp.url())
    monkeypatch.setenv(EMAIL_TO_VAR, RECIPIENT)
    monkeypatch.delenv("RASTRO_ALERT_EMAIL_FROM", raising=False)
    for name in THRESHOLD_VARS:
        monkeypatch.delenv(name, raising=False)
    # The snapshot is judged on the wall clock, which publishes stamp, and this world's clock
    # is pinned days before it: never published would count from a link days old.
    monkeypatch.setenv("RASTRO_ALERT_SNAPSHOT_MINUTES", str(MAX_ALERT_MINUTES))
    # Everything the product logs is captured, so the leak scan reads all of it.
    caplog.set_level(logging.DEBUG)


@dataclass
class Daemon:
    """The daemon's side of `meta_incidents`: one tick at a pinned instant, the cursor kept
    between ticks, and the check evaluation stored in the instance as the daemon stores it."""

    instance: dg.DagsterInstance
    rastro_at: Callable[[datetime], object]
    cursor: str | None = None

    def tick(self, at: datetime) -> dg.AssetCheckEvaluation | None:
        """The `no_open_incidents` evaluation this tick reported, None when it reported none."""
        from rastro_assets.definitions import defs

        # With the instance's ref and the sensor's name, its log lines are also stored in the
        # Dagster home, as the daemon stores each tick's: the leak scan reads them there.
        context = dg.build_sensor_context(
            instance=self.instance,
            instance_ref=self.instance.get_ref(),
            repository_name=REPOSITORY,
            sensor_name=INCIDENTS_SENSOR,
            definitions=defs,
            resources={"rastro": self.rastro_at(at)},
            cursor=self.cursor,
        )
        with context:
            result = meta_incidents_sensor(context)
        assert isinstance(result, dg.SensorResult), result
        assert not result.run_requests
        self.cursor = result.cursor
        reported = list(result.asset_events or [])
        if not reported:
            return None
        [evaluation] = reported
        assert isinstance(evaluation, dg.AssetCheckEvaluation)
        assert evaluation.check_name == NO_OPEN_INCIDENTS
        self.instance.report_runless_asset_event(evaluation)
        return evaluation


@pytest.fixture
def daemon(instance, rastro_at, alerting) -> Daemon:
    return Daemon(instance, rastro_at)


def events(hook: WebhookReceiver) -> list[tuple[str, str]]:
    return [(body["rastro_event"], body["rastro_incident"]) for body in hook.bodies]


def sync_both(instance, rastro_at, fake_clock, at: datetime, *, succeeds: bool = True):
    """A live wave of both accounts at `at`, as the cadence starts one."""
    fake_clock.set(at)
    result = run_wave(
        instance, rastro_at(at), [live("act_101"), live("act_202")], raise_on_error=False
    )
    assert result.success == succeeds
    return result


def last_outcomes(warehouse) -> dict[str, str]:
    with warehouse.connect(read_only=True) as con:
        runs = runs_by_account(sync_run_rows(con))
    return {account: history[-1].outcome for account, history in runs.items()}


def open_count(evaluation: dg.AssetCheckEvaluation) -> int:
    return evaluation.metadata["open_incidents"].value


# --- leaks ----------------------------------------------------------------------------------

SECRETS = (
    WEBHOOK_SECRET_PATH,
    SMTP_PASSWORD,
    SMTP_PASSWORD_IN_URL,
    TOKEN,
    NEW_TOKEN,
)


def assert_nothing_leaked(tmp_path: Path, capsys, caplog) -> None:
    """No secret in the bytes of any file under `tmp_path`, in any text a DuckDB file there
    holds (DuckDB compresses strings, so a file's bytes alone could hide one), in stdout,
    stderr or any log record."""
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret!r} in {path}"
    # The warehouse, and the analytics snapshot and its staging copy when published.
    databases = [path for path in files if path.read_bytes()[8:12] == b"DUCK"]
    assert tmp_path / "data" / "rastro.duckdb" in databases
    for path in databases:
        assert_no_secret_in_database(path)
    # Each capture is live: the sensor's lines reach stderr and the stored tick logs, the
    # syncs' reach the log records.
    tick_logs = [path for path in files if REPOSITORY in path.parts and path.suffix == ".err"]
    assert any(b"sent to " in path.read_bytes() for path in tick_logs)
    captured = capsys.readouterr()
    assert "sent to " in captured.err
    assert any(record.name.startswith("rastro_fake_graph") for record in caplog.records)
    logged = [record.getMessage() for record in caplog.records]
    for secret in SECRETS:
        assert secret not in captured.out
        assert secret not in captured.err
        assert not [line for line in logged if secret in line]


def assert_no_secret_in_database(path: Path) -> None:
    with duckdb.connect(str(path), read_only=True) as con:
        tables = con.execute(
            "SELECT schema_name, table_name, list(column_name) FROM duckdb_columns() "
            "WHERE database_name = current_database() GROUP BY ALL"
        ).fetchall()
        assert tables, path
        for schema, table, columns in tables:
            text = " || '|' || ".join(f'coalesce(CAST("{c}" AS VARCHAR), \'\')' for c in columns)
            for secret in SECRETS:
                [(count,)] = con.execute(
                    f'SELECT count(*) FROM "{schema}"."{table}" WHERE contains({text}, ?)',
                    [secret],
                ).fetchall()
                assert count == 0, f"{secret!r} in {path.name}: {schema}.{table}"


# --- a dead token ---------------------------------------------------------------------------


def assert_token_notice(text: str) -> None:
    assert text.startswith("OPEN: connection c1's token is invalid: it pauses 2 accounts")
    assert "sites s1 (2 accounts), s2 (1 account)" in text
    assert "act_101 (sites s1): `META_TOKEN_INVALID" in text
    assert "act_202 (sites s1, s2): `META_TOKEN_INVALID" in text
    assert "`rastro connect c1`" in text
    assert "Incident token:c1 on " in text


def test_a_dead_token_is_said_once_on_each_channel_and_once_when_reconnected(
    daemon, hook, smtp, instance, rastro_at, fake_world, fake_clock, warehouse, vault,
    tmp_path, capsys, caplog,
):
    quiet = daemon.tick(NOW)
    assert quiet is not None and quiet.passed
    assert quiet.description.startswith("no open incidents. Alerts: every notice delivered to ")
    assert (hook.bodies, smtp.messages) == ([], [])

    fake_world.kill_token(TOKEN)
    # Every account of the wave fails: the run fails too.
    sync_both(instance, rastro_at, fake_clock, minutes(5), succeeds=False)
    assert last_outcomes(warehouse) == {"act_101": "token", "act_202": "token"}
    with warehouse.connect(read_only=True) as con:
        assert registry.get_connection(con, "c1").invalid_since is not None

    failing = daemon.tick(minutes(6))
    assert events(hook) == [("opened", "token:c1")]
    assert_token_notice(hook.texts[0])
    [mail] = smtp.messages
    assert mail.authenticated and mail.rcpt_tos == [RECIPIENT]
    assert mail.subject.startswith("[rastro] OPEN: connection c1's token is invalid")
    assert_token_notice(mail.text)
    assert mail.text.strip() == hook.texts[0].strip()
    assert failing is not None and not failing.passed
    assert failing.description.startswith("1 open. token:c1: connection c1's token")
    assert "`rastro connect c1`" in failing.description
    assert open_count(failing) == 1
    assert failing.metadata["channel_status"].value.startswith("every notice delivered to ")

    # Found again: nothing new to say, and nothing new to report.
    assert daemon.tick(minutes(7)) is None
    assert (len(hook.bodies), len(smtp.messages)) == (1, 1)

    # The daemon restarts: no cursor, a new resource; the stored incident is not said again.
    restarted = Daemon(instance, rastro_at)
    again = restarted.tick(minutes(8))
    assert again is not None and not again.passed and "token:c1" in again.description
    assert (len(hook.bodies), len(smtp.messages)) == (1, 1)

    # `rastro connect c1` with a new token, then the next wave reads with it.
    with warehouse.connect() as con:
        registry.save_connection(con, "c1", vault.seal("c1", NEW_TOKEN), minutes(9))
    for account in ("act_101", "act_202"):
        fake_world.grant(NEW_TOKEN, account)
    sync_both(instance, rastro_at, fake_clock, minutes(10))
    assert last_outcomes(warehouse) == {"act_101": "ok", "act_202": "ok"}

    resolved = restarted.tick(minutes(11))
    assert events(hook) == [("opened", "token:c1"), ("resolved", "token:c1")]
    assert hook.texts[1].startswith("RESOLVED after 5 min: connection c1's token is invalid")
    assert len(smtp.messages) == 2
    assert smtp.messages[1].subject.startswith("[rastro] RESOLVED after 5 min: connection c1")
    assert resolved is not None and resolved.passed
    assert resolved.description.startswith("no open incidents. ")
    assert restarted.tick(minutes(12)) is None
    assert (len(hook.bodies), len(smtp.messages)) == (2, 2)

    assert_nothing_leaked(tmp_path, capsys, caplog)


# --- a receiver that is down ------------------------------------------------------------------


def test_a_receiver_that_is_down_is_tried_again_with_back_off_and_holds_up_no_sync(
    daemon, hook, smtp, monkeypatch, instance, rastro_at, fake_clock, warehouse,
    tmp_path, capsys, caplog,
):
    # Linked at NOW and never backfilled: stuck 20 minutes on.
    monkeypatch.setenv("RASTRO_ALERT_STUCK_MINUTES", "20")
    hook.status = 503

    down = daemon.tick(minutes(21))
    assert events(hook) == []
    assert len(hook.refused) == 1 and hook.refused[0]["rastro_incident"] == "stuck:c1"
    [mail] = smtp.messages  # the other channel is not held up
    assert mail.subject.startswith(
        "[rastro] OPEN: the backfills of 2 accounts of connection c1 have not moved"
    )
    assert down is not None and not down.passed
    status = down.metadata["channel_status"].value
    assert status.startswith(f"{WEBHOOK_LABEL}: 1 notice not delivered since ")
    assert status.endswith(f"({WEBHOOK_LABEL}: HTTP 503)")
    assert f"Alerts: {WEBHOOK_LABEL}: 1 notice not delivered" in down.description
    for shown in (down.description, status, str(down.metadata)):
        assert WEBHOOK_SECRET_PATH not in shown
        assert f"127.0.0.1:{urlsplit(hook.url).port}" not in shown

    # A sync started meanwhile reads and records as ever.
    wave = sync_both(instance, rastro_at, fake_clock, minutes(21.5))
    assert wave.success
    assert last_outcomes(warehouse) == {"act_101": "ok", "act_202": "ok"}

    # Tried again a minute after the first try, then two minutes after the second.
    assert daemon.tick(minutes(21.9)) is None
    assert len(hook.refused) == 1
    daemon.tick(minutes(22))
    assert len(hook.refused) == 2
    hook.status = 200
    daemon.tick(minutes(23.9))
    assert (len(hook.refused), hook.bodies) == (2, [])
    delivered = daemon.tick(minutes(24))
    assert events(hook) == [("opened", "stuck:c1")]
    assert hook.texts[0].strip() == mail.text.strip()
    assert delivered is not None and not delivered.passed
    assert delivered.metadata["channel_status"].value.startswith("every notice delivered to ")
    assert daemon.tick(minutes(30)) is None
    assert (len(hook.bodies), len(hook.refused), len(smtp.messages)) == (1, 2, 1)

    assert_nothing_leaked(tmp_path, capsys, caplog)


# --- thresholds -------------------------------------------------------------------------------


def fill(instance, rastro, account: str) -> None:
    """`spend_backfill` reads the account's 90 days, as the fill backfill's run does."""
    result = dg.materialize(
        [build_spend_fill(0, 1)],
        instance=instance,
        resources={"rastro": rastro},
        tags={RANGE_START_TAG: account, RANGE_END_TAG: account},
    )
    assert result.success


def test_a_stale_account_and_a_stuck_backfill_are_one_message_each_at_their_thresholds(
    daemon, hook, smtp, monkeypatch, instance, rastro_at, tmp_path, capsys, caplog,
):
    monkeypatch.setenv("RASTRO_ALERT_STUCK_MINUTES", "30")
    monkeypatch.setenv("RASTRO_ALERT_STALE_MINUTES", "90")
    # act_101 is backfilled (its today read at NOW); act_202's backfill never starts.
    fill(instance, rastro_at(NOW), "act_101")

    assert daemon.tick(minutes(29)).passed
    assert (hook.bodies, smtp.messages) == ([], [])

    stuck = daemon.tick(minutes(31))
    assert events(hook) == [("opened", "stuck:c1")]
    assert "act_202 (sites s1, s2): 0 of 90 days read" in hook.texts[0]
    assert "act_101" not in hook.texts[0]
    assert stuck is not None and not stuck.passed and open_count(stuck) == 1

    assert daemon.tick(minutes(89)) is None
    assert len(hook.bodies) == 1

    stale = daemon.tick(minutes(91))
    assert events(hook) == [("opened", "stuck:c1"), ("opened", "stale:c1")]
    assert hook.texts[1].startswith("OPEN: 1 account of connection c1 is stale")
    assert "act_101 (sites s1): today last read 1 h 31 min ago" in hook.texts[1]
    assert "act_202" not in hook.texts[1]
    assert stale is not None and open_count(stale) == 2
    assert [mail.subject.split(": ")[0] for mail in smtp.messages] == [
        "[rastro] OPEN", "[rastro] OPEN",
    ]
    assert ["stuck" in smtp.messages[0].text, "stale" in smtp.messages[1].text] == [True, True]
    assert daemon.tick(minutes(100)) is None
    assert (len(hook.bodies), len(smtp.messages)) == (2, 2)

    assert_nothing_leaked(tmp_path, capsys, caplog)


# --- what others wrote ------------------------------------------------------------------------

HOSTILE = "<!channel> <!here> *URGENT* <https://evil.example/login|Re-authenticate here>"
"""Text Meta, or anyone who adds a partition in the UI, may put in front of a notice."""


def test_meta_s_words_and_a_partition_key_reach_the_channels_as_quoted_data(
    daemon, hook, smtp, instance, rastro_at, warehouse, now,
):
    from rastro_assets import shards
    from rastro_assets.defs.catalog import build_catalog_assets
    ad_catalog, _ = build_catalog_assets(1)

    with warehouse.connect() as con:
        sealed_at = registry.get_connection(con, "c1").sealed_at
        assert registry.mark_connection_invalid(
            con, "c1", f"META_TOKEN_INVALID: {HOSTILE}\n@channel", now, token_sealed_at=sealed_at
        )
    # A partition added by hand in the UI, materialized until its runs fail three in a row.
    instance.add_dynamic_partitions(shards.accounts_name(0), [HOSTILE])
    for _ in range(3):
        assert not dg.materialize(
            [ad_catalog], partition_key=HOSTILE, instance=instance,
            resources={"rastro": rastro_at(NOW)}, raise_on_error=False,
        ).success

    daemon.tick(minutes(1))
    by_incident = {body["rastro_incident"]: body for body in hook.bodies}
    assert set(by_incident) == {"token:c1", "run_failures:__ephemeral_asset_job__"}
    token = by_incident["token:c1"]["text"]
    assert "Meta said: `META_TOKEN_INVALID: &lt;!channel&gt; &lt;!here&gt; *URGENT* " in token
    assert "Re-authenticate here&gt; @channel`\n" in token
    failure = by_incident["run_failures:__ephemeral_asset_job__"]["text"]
    assert "latest failure: `ad account id '&lt;!channel&gt; &lt;!here&gt; *URGENT* " in failure
    for body in hook.bodies:
        for field in ("text", "rastro_subject"):
            assert "<" not in body[field] and ">" not in body[field]

    mails = {mail.subject.split(":")[1].strip(): mail for mail in smtp.messages}
    assert len(mails) == 2 and all("\n" not in subject for subject in mails)
    # Plain text: the data shows as it is, but only inside its backticks.
    for mail in smtp.messages:
        assert mail.message["Subject"] == mail.subject and mail.message["To"] == RECIPIENT
        outside = re.sub(r"`[^`\n]*`", "", mail.text)
        assert "<!channel>" not in outside and "evil.example" not in outside
    [token_mail] = [mail for mail in smtp.messages if "token" in mail.subject]
    assert f"Meta said: `META_TOKEN_INVALID: {HOSTILE} @channel`\n" in token_mail.text


# --- the channels as set now ------------------------------------------------------------------


def test_the_check_names_the_channels_as_set_now_not_at_the_last_incident(
    daemon, hook, monkeypatch
):
    for name in (WEBHOOK_URLS_VAR, SMTP_URL_VAR, EMAIL_TO_VAR):
        monkeypatch.delenv(name)
    unset = daemon.tick(NOW)
    assert unset is not None and unset.passed
    assert "Alerts: no channel is set" in unset.description

    # The channel is set and the daemon restarted with it: nothing else changed.
    monkeypatch.setenv(WEBHOOK_URLS_VAR, hook.url)
    now_set = daemon.tick(minutes(1))
    assert now_set is not None and now_set.passed
    assert now_set.description == (
        f"no open incidents. Alerts: every notice delivered to {WEBHOOK_LABEL}"
    )
    assert daemon.tick(minutes(2)) is None
    assert hook.bodies == []


# --- the daemon's start -----------------------------------------------------------------------


def sensor_ticked(instance: dg.DagsterInstance, name: str, at: datetime) -> None:
    """A tick of the cadence sensor `name` at `at`, stored as the daemon stores it (its state
    made at its first tick)."""
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteRepositoryOrigin
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        SensorInstigatorData,
        TickData,
        TickStatus,
    )

    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("rastro"), REPOSITORY)
    origin = repository.get_instigator_origin(name)
    state = instance.get_instigator_state(origin.get_id(), origin.get_selector().get_id())
    if state is None:
        state = InstigatorState(
            origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING,
            SensorInstigatorData(min_interval=30),
        )
        instance.add_instigator_state(state)
    instance.create_tick(
        TickData(
            instigator_origin_id=origin.get_id(),
            instigator_name=name,
            instigator_type=InstigatorType.SENSOR,
            status=TickStatus.SKIPPED,
            timestamp=at.timestamp(),
            selector_id=state.selector_id,
            skip_reason="nothing due",
        )
    )


def test_a_daemon_restart_after_a_pause_opens_nothing_and_resolves_nothing(
    daemon, hook, instance
):
    for minute in (0, 1, 2):
        sensor_ticked(instance, "meta_accounts", minutes(minute))
        daemon.tick(minutes(minute) + timedelta(seconds=10))
    # The daemon is down 18 minutes, longer than a sensor may be silent (10); its restart
    # keeps the sensor's cursor, as Dagster stores it. The incident check ticks first.
    restart = minutes(20)
    daemon.tick(restart + timedelta(seconds=6))
    sensor_ticked(instance, "meta_accounts", restart + timedelta(seconds=20))
    for second in (66, 126, 186, 246, 606):
        daemon.tick(restart + timedelta(seconds=second))
    assert events(hook) == []


def test_a_sensor_still_silent_past_the_start_s_grace_opens_once(daemon, hook, instance):
    sensor_ticked(instance, "meta_accounts", minutes(0))
    daemon.tick(minutes(0) + timedelta(seconds=10))
    restart = minutes(20)
    for second in (6, 66, 126):
        daemon.tick(restart + timedelta(seconds=second))
    assert events(hook) == []
    # Two and a half minutes after the start, meta_accounts has still not ticked.
    daemon.tick(restart + timedelta(seconds=186))
    assert events(hook) == [("opened", "sensor:meta_accounts")]
    assert hook.texts[0].startswith("OPEN: the sensor meta_accounts has not ticked for 23 min")
    daemon.tick(restart + timedelta(seconds=246))
    assert events(hook) == [("opened", "sensor:meta_accounts")]
    # It ticks again: resolved, once.
    sensor_ticked(instance, "meta_accounts", restart + timedelta(seconds=250))
    daemon.tick(restart + timedelta(seconds=306))
    daemon.tick(restart + timedelta(seconds=366))
    assert events(hook) == [
        ("opened", "sensor:meta_accounts"), ("resolved", "sensor:meta_accounts"),
    ]


# --- one incident per trouble -----------------------------------------------------------------


def test_waves_failing_on_their_accounts_own_trouble_are_not_a_second_incident(
    daemon, hook, instance, rastro_at, fake_world, fake_clock
):
    # Meta answers every read with an error the product has no name for: META_UNAVAILABLE.
    fake_world.fail("insights", "other", times=None)
    for minute in (1, 16, 46):
        sync_both(instance, rastro_at, fake_clock, minutes(minute), succeeds=False)
    daemon.tick(minutes(47))
    assert events(hook) == [("opened", "unavailable:c1")]
    assert "2 accounts of connection c1 could not be read" in hook.texts[0]
