"""End to end: the rehearsal of a bad day that docs/running.md walks through, on a running
demo (a temp checkout, `rastro demo`, its own daemon) whose alerts go to a loopback webhook.

Each kind of trouble is staged with `rastro demo trouble` as an operator types it (a
subprocess in the checkout, no variable exported), and taken away the same way: a throttle
on one account and a lost permission on another at once, then a slow Meta, then the dead
token, whose fix is the notice's own (`rastro connect demo`). Each trouble is told to the
webhook once as opened, and once as resolved after it is taken away; and the demo's output
holds no stack trace on the dead token.

The demo accounts' 90-day backfills are recorded as done before the demo starts, as
`test_alerts_daemon` does: the rehearsal starts from a demo that has run a while, and the
first live syncs come at once instead of after two minutes of backfill.
"""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rastro_assets import demo
from rastro_assets.demo.graph import read_graph_file
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.alerts.receivers import webhook_receiver
from rastro_assets_tests.conftest import record_sync_run
from rastro_assets_tests.e2e.demo_harness import (
    RASTRO,
    Copy,
    copy_tracked_files,
    running_demo,
    stop,
    wait_for,
)
from rastro_fake_graph.world import DEMO_TOKEN

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc"),
]

ACCOUNTS = sorted({account for accounts in demo.DEMO_LINKS.values() for account in accounts})
THROTTLED = "act_1003"
LOST = "act_1001"
CONNECTION = demo.DEMO_CONNECTION
NOTICE_SECONDS = 150
"""How long a notice may take: the sync asked for (a sensor tick, a run's start on a loaded
machine), then the incident sensor's tick."""
STARTUP_SECONDS = 180
THRESHOLD = "RASTRO_ALERT_RATE_LIMITED_MINUTES"


def seeded(copy: Copy) -> None:
    """The demo prepared, each account's backfill recorded as done and a sync asked for."""
    paths = DemoPaths(copy.root)
    demo.prepare(paths, environ={})
    now = datetime.now(UTC)
    with Warehouse(paths.duckdb).connect() as con:
        for account in registry.linked_accounts(con):
            today = local_date(now, account.timezone)
            record_sync_run(
                con, f"seeded-{account.ad_account_id}", account.ad_account_id, "backfill",
                today - timedelta(days=89), today, now - timedelta(minutes=1), catalog=True,
            )
            registry.request_sync(con, account.ad_account_id, now)


def live_since(copy: Copy, since: datetime) -> set[str]:
    """The accounts with a good live sync started after `since`."""
    return {
        account
        for account, kind, started_at, outcome, _ in copy.runs()
        if kind in ("live", "daily", "weekly") and outcome == "ok" and started_at > since
    }


def operator_env(copy: Copy) -> dict[str, str]:
    """What an operator's shell in the checkout has: no RASTRO_* variable."""
    return {name: value for name, value in copy.env.items() if not name.startswith("RASTRO_")}


def rastro(copy: Copy, *args: str, stdin: str | None = None) -> str:
    """`rastro ARGS` in the checkout as an operator types it; its stdout, exit 0 asserted."""
    result = subprocess.run(
        [str(RASTRO), *args], cwd=copy.root, env=operator_env(copy), input=stdin,
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, f"rastro {' '.join(args)}: {result.stderr}"
    return result.stdout


def checked(copy: Copy) -> tuple[int, list[str]]:
    """`rastro status --check` as docs/running.md has it run in the demo's folder, with
    nothing exported (the demo's Dagster home and threshold are taken there): its exit code,
    and the keys of the incidents it prints."""
    result = subprocess.run(
        [str(RASTRO), "status", "--check"], cwd=copy.root, env=operator_env(copy),
        capture_output=True, text=True, timeout=120,
    )
    return result.returncode, sorted(line.split(": ", 1)[0] for line in result.stdout.splitlines())


def told(bodies: list[dict], event: str) -> list[str]:
    return sorted(body.get("rastro_incident", "?") for body in bodies
                  if body.get("rastro_event") == event)


def wait_for_notices(
    hook, event: str, keys: set[str] | None, *, before: set[str] = frozenset(),
    seconds: float = NOTICE_SECONDS,
) -> None:
    """Until `event` notices of each of `keys` arrived (None: of any key not in `before`)."""
    def arrived() -> bool:
        seen = set(told(hook.bodies, event))
        return bool(seen - before) if keys is None else keys <= seen

    try:
        wait_for(f"{event} notices of {sorted(keys or ['a new incident'])}", arrived, seconds)
    except AssertionError:
        print("\n".join(f"{b.get('rastro_event')} {b.get('rastro_incident')}: {b.get('text')}"
                        for b in hook.bodies))
        raise


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_each_trouble_is_told_once_and_resolved_once(tmp_path):
    began = time.monotonic()
    timings: dict[str, float] = {}

    def reached(what: str) -> None:
        timings[what] = time.monotonic() - began
        print(f"{timings[what]:.0f} s: {what}; told: {told(hook.bodies, 'opened')} opened,"
              f" {told(hook.bodies, 'resolved')} resolved", flush=True)

    root = tmp_path / "repo"
    copy_tracked_files(root)
    copy = Copy(root)
    seeded(copy)
    log = tmp_path / "demo.log"
    graph_file = DemoPaths(root).graph_file
    throttle_and_permission = {f"rate_limited:{CONNECTION}", f"permission:{CONNECTION}"}
    token = f"token:{CONNECTION}"
    with webhook_receiver() as hook:
        copy.env["RASTRO_ALERT_WEBHOOK_URLS"] = hook.url
        # The demo's own: a throttle is told once it has lasted a minute.
        assert THRESHOLD not in copy.env
        with running_demo(copy, log) as process:
            started_at = datetime.now(UTC)
            wait_for("the demo's fake Graph", lambda: read_graph_file(graph_file), 60)
            wait_for(
                "a live sync of every demo account",
                lambda: live_since(copy, started_at - timedelta(minutes=1)) == set(ACCOUNTS),
                STARTUP_SECONDS,
            )
            reached("every account live")
            assert hook.bodies == []

            # A throttle on one account and a lost permission on another, at once.
            rastro(copy, "demo", "trouble", "throttle", THROTTLED)
            rastro(copy, "demo", "trouble", "lost-permission", LOST)
            wait_for_notices(hook, "opened", throttle_and_permission)
            reached("throttle and lost permission told")
            said = rastro(copy, "status")
            assert THROTTLED in said and LOST in said
            assert checked(copy) == (1, sorted(throttle_and_permission))
            rastro(copy, "demo", "trouble", "mend")
            wait_for_notices(hook, "resolved", throttle_and_permission)
            reached("throttle and lost permission resolved")
            assert checked(copy) == (0, ["ok"])

            dead_from = len(log.read_text(errors="replace"))
            rastro(copy, "demo", "trouble", "dead-token")
            wait_for_notices(hook, "opened", {token})
            reached("dead token told")
            mended = rastro(copy, "demo", "trouble", "mend", "dead-token")
            assert f"`rastro connect {CONNECTION}`" in mended
            # The notice's fix, as written.
            rastro(copy, "connect", CONNECTION, stdin=DEMO_TOKEN)
            wait_for_notices(hook, "resolved", {token})
            reached("dead token resolved")
            on_dead_token = log.read_text(errors="replace")[dead_from:]

            rastro(copy, "demo", "trouble", "slow")
            before = set(told(hook.bodies, "opened"))
            wait_for_notices(hook, "opened", None, before=before)
            [slow] = set(told(hook.bodies, "opened")) - before
            reached(f"slow Meta told as {slow}")
            rastro(copy, "demo", "trouble", "mend", "slow")
            wait_for_notices(hook, "resolved", {slow})
            reached("slow Meta resolved")
            stop(process, signal.SIGTERM)

    for body in hook.bodies:
        print(f"{body.get('rastro_event')} {body.get('rastro_incident')}: {body.get('text')}")
    told_once = sorted([*throttle_and_permission, token, slow])
    assert told(hook.bodies, "opened") == told_once
    assert told(hook.bodies, "resolved") == told_once
    assert "Traceback" not in on_dead_token
    assert not [line for line in on_dead_token.splitlines() if line.lstrip().startswith('File "')]
    assert not graph_file.exists()
