"""Screenshots of the Dagster UI pages a new user sees first, after `rastro demo`.

A fresh clone's first hour is `rastro demo` and then the UI. Reading its GraphQL answers in a
test proves the figures; only a browser shows what a person reads. This script:

1. copies the repo's tracked files (as they are in the work tree) to a temp dir, as a clone;
2. runs `rastro demo --port P` there in a session of its own, with the sensors ticking every
   5 s and the analytics lag at 30 s (as `rastro_assets_tests/e2e/test_demo_e2e.py` does), and
   waits for its `rastro demo: ready:` line (the first backfills take ~2-4 min);
3. drives headless Chromium (Playwright) at 1440x900 over the pages below, waits for each one's
   data (network idle, then a text the page shows only once loaded) and saves a full-page PNG;
4. stops the demo with SIGTERM to its process group, always (SIGKILL to what is left after
   60 s), and removes the copy unless `--keep`.

`--url http://127.0.0.1:P` skips 1, 2 and 4 and photographs a UI that is already running.

Not test dependencies: Debian's `chromium` (`apt-get install -y chromium`, /usr/bin/chromium)
and `.venv/bin/pip install playwright` (no `playwright install`: the system browser is used).

Run: .venv/bin/python bench/screenshots.py [--out DIR] [--port P] [--keep] [--url URL]
The PNGs go to `--out` (default: a new temp dir), never into the repo; their paths are printed,
and last the line `screenshots: <N> pages in DIR`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RASTRO = Path(sys.executable).parent / "rastro"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1440, "height": 900}
# The UI scrolls inside its own panes, so a "full page" screenshot is the viewport: the window
# is grown to the tallest pane's content (up to this) to show all of it.
MAX_HEIGHT = 2400
LOCATION = "rastro_assets"
# Dagster's "Join the Dagster community" dialog covers every page of a new localhost UI; it
# stays dismissed in a browser whose localStorage says so (ui-core's CommunityNux.tsx).
DISMISS_COMMUNITY_NUX = "window.localStorage.setItem('communityNux', JSON.stringify('1'));"
READY = re.compile(r"^rastro demo: ready:", re.M)
OWN_LINE = "rastro demo: "
READY_SECONDS = 600
STOP_SECONDS = 60
# The UI polls (live asset data, run counts), so "network idle" can come late or between
# two polls before the page's own queries have rendered: each page also names a text to wait for.
IDLE_MS = 30_000
TEXT_MS = 60_000
SETTLE_MS = 1_500


@dataclass(frozen=True)
class Shot:
    name: str
    path: str
    # Shown only once the page's data is in (a spinner or skeleton shows none of them).
    wait_text: str
    what: str
    # The partitions list grows to every date of the axis: its first screen is what it says.
    grow: bool = True


SHOTS = (
    Shot("01-asset-graph", "/asset-groups", "meta_spend", "the global asset lineage"),
    Shot(
        "02-asset-graph-meta-spend",
        f"/locations/{LOCATION}/asset-groups/meta_spend",
        "ad_spend_daily",
        "the meta_spend group's lineage",
    ),
    Shot("03-catalog", "/assets", "ad_spend_daily", "the asset catalog"),
    Shot(
        "04-ad-spend-daily-overview",
        "/assets/ad_spend_daily?view=overview",
        "Row count",
        "ad_spend_daily, overview",
    ),
    Shot(
        "05-ad-spend-daily-partitions",
        "/assets/ad_spend_daily?view=partitions",
        "act_1001",
        "ad_spend_daily, partitions",
        grow=False,
    ),
    Shot(
        "06-ad-spend-daily-checks",
        "/assets/ad_spend_daily?view=checks",
        "accounts_fresh",
        "ad_spend_daily, checks",
    ),
    Shot(
        "06b-site-spend-daily-checks",
        "/assets/site_spend_daily?view=checks",
        "equals_sum_of_ad_spend",
        "site_spend_daily, checks",
    ),
    Shot(
        "07-meta-account-health-overview",
        "/assets/meta_account_health?view=overview",
        "act_1001",
        "meta_account_health (per-account view), overview",
    ),
    Shot(
        "08-meta-account-health-events",
        "/assets/meta_account_health?view=events",
        "act_1001",
        "meta_account_health, its latest materialization (Events)",
    ),
    Shot("09-ad-catalog", "/assets/ad_catalog?view=overview", "ad_catalog", "ad_catalog, overview"),
    Shot("10-automation", "/automation", "meta_cadence", "sensors (Automation)"),
    Shot(
        "11-meta-cadence-sensor",
        f"/locations/{LOCATION}/sensors/meta_cadence",
        "meta_cadence",
        "the meta_cadence sensor: ticks and cursor",
    ),
    Shot("12-backfills", "/runs?view=backfills", "Backfill", "Runs > Backfills"),
)


def copy_tracked_files(dest: Path) -> int:
    """The repo's tracked files as they are in the work tree (deleted ones skipped)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    copied = 0
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if not source.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    return copied


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_groups(sid: int) -> set[int]:
    """The live process groups of session `sid`: the demo's, and Dagster's own."""
    groups = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            # pid (comm) state ppid pgrp session ...; comm may hold spaces and parens.
            state, _ppid, pgrp, session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            if state != "Z" and int(session) == sid:
                groups.add(int(pgrp))
    return groups


def demo_env(root: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("RASTRO_", "DAGSTER_"))
    }
    # The copy's code, not the editable install's: what a clone would run.
    env["PYTHONPATH"] = str(root)
    env["RASTRO_ANALYTICS_LAG_SECONDS"] = "30"
    env["RASTRO_SENSOR_INTERVAL_SECONDS"] = "5"
    return env


@contextmanager
def running_demo(root: Path, port: int, log: Path) -> Iterator[subprocess.Popen]:
    """`rastro demo --port P` in `root`, in a session of its own; stopped on the way out."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(RASTRO), "demo", "--port", str(port)],
            cwd=root,
            env=demo_env(root),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    print(f"started `rastro demo --port {port}` (pid {process.pid}) in {root}; log {log}")
    try:
        yield process
    finally:
        stop_demo(process)


def stop_demo(process: subprocess.Popen) -> None:
    """SIGTERM to the demo's group (it hands it on to Dagster's); SIGKILL what outlives it."""
    started = time.monotonic()
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_SECONDS)
    while session_groups(process.pid) and time.monotonic() - started < STOP_SECONDS:
        time.sleep(0.5)
    left = session_groups(process.pid)
    for group in left:
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait()
    how = f"SIGKILL to {len(left)} group(s) left after {STOP_SECONDS} s" if left else "SIGTERM"
    print(
        f"stopped the demo ({how}) in {time.monotonic() - started:.1f} s,"
        f" exit code {process.returncode}"
    )


def wait_ready(process: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until the demo says "ready", echoing its own lines (not Dagster's log) as they come."""
    began = time.monotonic()
    echoed = 0
    while True:
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith(OWN_LINE)
        ]
        for line in lines[echoed:]:
            print(f"  [{time.monotonic() - began:5.0f} s] {line}")
        echoed = len(lines)
        if any(READY.match(line) for line in lines):
            print(f"the demo is ready after {time.monotonic() - began:.0f} s")
            return
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:]
            raise SystemExit(f"`rastro demo` exited with {process.returncode}:\n{tail}")
        if time.monotonic() - began > timeout:
            raise SystemExit(f'`rastro demo` did not say "ready" within {timeout:.0f} s')
        time.sleep(2)


# How far the tallest scrolling pane's content reaches past its visible part.
HIDDEN_HEIGHT_JS = """() => Math.max(0, ...Array.from(document.querySelectorAll('*')).map((el) => {
  const style = getComputedStyle(el);
  const scrolls = /(auto|scroll)/.test(style.overflowY) && el.clientHeight > 100;
  return scrolls ? el.scrollHeight - el.clientHeight : 0;
}))"""


def grow_to_content(page) -> int:
    """Grow the window until no pane scrolls (lists render more rows as it grows)."""
    height = VIEWPORT["height"]
    for _ in range(4):
        hidden = page.evaluate(HIDDEN_HEIGHT_JS)
        if hidden <= 0 or height >= MAX_HEIGHT:
            break
        height = min(height + hidden, MAX_HEIGHT)
        page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
        page.wait_for_timeout(SETTLE_MS)
    return height


def take_screenshots(url: str, out: Path) -> list[Path]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    saved = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.add_init_script(DISMISS_COMMUNITY_NUX)
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on(
                "console",
                lambda msg: (
                    problems.append(f"console {msg.type}: {msg.text[:300]}")
                    if msg.type == "error"
                    else None
                ),
            )
            for shot in SHOTS:
                problems.clear()
                began = time.monotonic()
                page.goto(url + shot.path, wait_until="domcontentloaded")
                notes = []
                try:
                    page.get_by_text(shot.wait_text).first.wait_for(timeout=TEXT_MS)
                except PlaywrightTimeout:
                    notes.append(f"never showed {shot.wait_text!r}")
                try:
                    page.wait_for_load_state("networkidle", timeout=IDLE_MS)
                except PlaywrightTimeout:
                    notes.append("network never idle")
                page.wait_for_timeout(SETTLE_MS)
                height = grow_to_content(page) if shot.grow else VIEWPORT["height"]
                path = out / f"{shot.name}.png"
                page.screenshot(path=str(path), full_page=True)
                page.set_viewport_size(VIEWPORT)
                saved.append(path)
                print(
                    f"{path}  ({shot.what}: {shot.path}, 1440x{height},"
                    f" {time.monotonic() - began:.1f} s)"
                    + "".join(f"\n    WARNING: {note}" for note in notes + problems)
                )
        finally:
            browser.close()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="where the PNGs go (default: a new temp dir)")
    parser.add_argument("--port", type=int, help="the demo's UI port (default: a free one)")
    parser.add_argument("--url", help="photograph this running UI instead of starting a demo")
    parser.add_argument("--keep", action="store_true", help="keep the repo copy and its data")
    parser.add_argument("--ready-timeout", type=float, default=READY_SECONDS)
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no {CHROMIUM}: apt-get install -y chromium")
    out = (args.out or Path(tempfile.mkdtemp(prefix="rastro-shots-"))).resolve()

    if args.url:
        saved = take_screenshots(args.url.rstrip("/"), out)
    else:
        work = Path(tempfile.mkdtemp(prefix="rastro-screenshots-"))
        root = work / "repo"
        try:
            print(f"copied {copy_tracked_files(root)} tracked files to {root}")
            port = args.port or free_port()
            log = work / "demo.log"
            with running_demo(root, port, log) as process:
                wait_ready(process, log, args.ready_timeout)
                saved = take_screenshots(f"http://127.0.0.1:{port}", out)
        finally:
            if args.keep:
                print(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
    print(f"screenshots: {len(saved)} pages in {out}")


if __name__ == "__main__":
    main()
