"""A publisher process killed with SIGKILL in the middle of a publish.

The child (`_publish_child.py`) kills itself at a chosen step: inside the staging refresh's
transaction, after its commit but before the checkpoint, halfway through the copy, with the
copy whole but not flushed nor renamed, and just after the rename. Whatever the step, the
snapshot at the target path opens in another process and is whole: the previous publish's
(or, once renamed, the new one's), never a half file; and the next publish, by a live
process, succeeds without healing anything and equals the pipeline. A last test kills a
child publishing in a loop at moments of no one's choosing.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from rastro_assets.analytics.publish import Publisher
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse.connection import register_arrow
from rastro_assets_tests.analytics._publish_child import POINTS
from rastro_assets_tests.analytics.analyst import Analyst
from rastro_assets_tests.analytics.helpers import WEEK, assert_snapshot_equals_pipeline
from rastro_assets_tests.conftest import NOW
from rastro_fake_graph.world import Figures

REPO = Path(__file__).resolve().parents[2]
CHILD_AT = NOW + timedelta(hours=1)
BULK_THUMBNAILS = 600  # ~5 MB of images: the copy and its fsync take measurable time
LOOP_THUMBNAILS = 1500  # ~12 MB more for the loop's child
# When the loop's child dies: a fraction of the way through the refresh, or the copy, as long
# as its previous publish took them.
KILL_MOMENTS = (("refresh", 0.5), ("copy", 0.3), ("copy", 0.7))

# What both files hold; the snapshot adds account_sync_status and snapshot_info.
TOTALS = """
    SELECT (SELECT count(*) FROM ad_spend_daily), (SELECT sum(spend) FROM ad_spend_daily),
           (SELECT count(*) FROM site_spend_daily), (SELECT sum(spend) FROM site_spend_daily),
           (SELECT count(*) FROM ad_catalog), (SELECT count(*) FROM ad_thumbnails),
           (SELECT sum(octet_length(image)) FROM ad_thumbnails),
           (SELECT count(*) FROM meta_ad_accounts), (SELECT count(*) FROM site_ad_accounts)
"""
SNAPSHOT_TOTALS = TOTALS + """,
           (SELECT count(*) FROM account_sync_status), (SELECT max(published_at) FROM snapshot_info)
"""


@pytest.fixture
def snapshot_path(tmp_path: Path) -> Path:
    return tmp_path / "analysts" / "analytics.duckdb"


@pytest.fixture
def publisher(warehouse, snapshot_path, fake_clock) -> Publisher:
    return Publisher(warehouse, snapshot_path, clock=fake_clock)


def snapshot_totals(path: Path, *, own_process: bool = True) -> list:
    """The totals as an analyst sees them: read-only, in a process of its own (or in a fresh
    connection of this one)."""
    if own_process:
        with Analyst(path) as analyst:
            [row] = analyst.query(SNAPSHOT_TOTALS)
        return row
    with duckdb.connect(str(path), read_only=True) as con:
        row = con.execute(SNAPSHOT_TOTALS).fetchone()
    return [str(value) if isinstance(value, Decimal) else value for value in row]


def pipeline_totals(warehouse) -> list:
    with warehouse.connect() as con:
        row = con.execute(TOTALS).fetchone()
    return [str(value) if isinstance(value, Decimal) else value for value in row]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def previous(syncer, warehouse, publisher, snapshot_path, linked_world, fake_clock):
    """A published snapshot, then a pipeline that has moved on: the totals and digest of
    the snapshot as published."""
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    add_thumbnails(warehouse, "bulk", BULK_THUMBNAILS)
    assert publisher.publish() is not None
    published = {"totals": snapshot_totals(snapshot_path), "digest": digest(snapshot_path)}

    # What the killed publish would have carried: a new account, changed and gone ad-days.
    with warehouse.connect() as con:
        ad_id, day = con.execute("SELECT ad_id, day FROM ad_spend_daily LIMIT 1").fetchone()
    linked_world.set_ad_day("act_101", ad_id, day, None)
    other = next(row for row in linked_world.truth("act_101", WEEK[1]) if row.ad_id != ad_id)
    linked_world.set_ad_day(
        "act_101", other.ad_id, WEEK[1], Figures(spend=Decimal("77.70"), impressions=5, clicks=1)
    )
    fake_clock.advance(timedelta(minutes=45))
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r2")).ok
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r3")).ok
    assert pipeline_totals(warehouse) != published["totals"][:9]
    return published


def add_thumbnails(warehouse, prefix: str, count: int) -> None:
    """`count` JPEG-sized images (random bytes) for ads `<prefix>_<n>`."""
    rng = random.Random(prefix)
    images = [rng.randbytes(rng.randint(4096, 12288)) for _ in range(count)]
    table = pa.table({
        "ad_id": [f"{prefix}_{index}" for index in range(count)],
        "content_type": ["image/jpeg"] * count,
        "image": pa.array(images, pa.binary()),
        "sha256": [hashlib.sha256(image).hexdigest() for image in images],
        "creative_id": [None] * count,
        "fetched_at": pa.array([NOW] * count, pa.timestamp("us", tz="UTC")),
    })
    with warehouse.connect() as con:
        register_arrow(con, "more_thumbnails", table)
        con.execute("INSERT INTO ad_thumbnails SELECT * FROM more_thumbnails")
        con.unregister("more_thumbnails")


def child_command(warehouse, snapshot_path: Path, point: str) -> list[str]:
    return [
        sys.executable, "-m", "rastro_assets_tests.analytics._publish_child",
        "--db", warehouse.path, "--target", str(snapshot_path), "--at", CHILD_AT.isoformat(),
        "--kill-at", point,
    ]


def temporary_files(snapshot_path: Path) -> list[Path]:
    return sorted(snapshot_path.parent.glob(f".{snapshot_path.name}.*.tmp"))


def assert_next_publish_equals_pipeline(
    warehouse, publisher, snapshot_path: Path, *, owed: bool | None = True
) -> None:
    """`owed`: whether the killed publish must have left its publish unrecorded (None: it
    may have finished one before it died)."""
    if owed is not None:
        with warehouse.connect() as con:
            assert publisher.state(con).owed == owed
    result = publisher.publish()
    assert result is not None
    assert result.healed == ()
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)
    assert snapshot_totals(snapshot_path)[:9] == pipeline_totals(warehouse)
    assert temporary_files(snapshot_path) == []
    assert not publisher.staging.with_name(publisher.staging.name + ".wal").exists()
    with warehouse.connect() as con:
        assert not publisher.state(con).owed


@pytest.mark.parametrize("point", POINTS)
def test_a_publish_killed_midway_leaves_a_whole_snapshot(
    point, previous, warehouse, publisher, snapshot_path, tmp_path
):
    log = tmp_path / "child.log"
    with log.open("wb") as stderr:
        child = subprocess.run(
            child_command(warehouse, snapshot_path, point),
            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, timeout=120,
        )
    said = child.stdout.decode().strip()
    assert child.returncode == -signal.SIGKILL, (child.returncode, said, log.read_text())
    assert said.startswith(f"killing {point}"), (said, log.read_text())

    staging_wal = publisher.staging.with_name(publisher.staging.name + ".wal")
    leftovers = temporary_files(snapshot_path)
    if point == "refresh":  # the transaction had replaced account-days when it died
        assert int(said.split()[2]) > 0
    if point == "checkpoint":  # committed, not yet checkpointed: the next attach replays it
        assert staging_wal.exists()
    if point == "copy":
        assert [path.stat().st_size for path in leftovers] == [int(said.split()[2]) // 2]
    if point == "flush":  # the whole copy, less the staging file's bookkeeping
        [copy] = leftovers
        assert 0 < copy.stat().st_size <= publisher.staging.stat().st_size

    if point == "rename":  # the new snapshot is in place, whole; its publish was not recorded
        assert snapshot_totals(snapshot_path)[:9] == pipeline_totals(warehouse)
    else:
        assert digest(snapshot_path) == previous["digest"]
        assert snapshot_totals(snapshot_path) == previous["totals"]
    assert_next_publish_equals_pipeline(warehouse, publisher, snapshot_path)


def read_line(stream, timeout_seconds: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_seconds)
    if not ready:
        raise AssertionError(f"the child said nothing within {timeout_seconds:.0f} s")
    return stream.readline().decode().strip()


def test_publishes_killed_at_moments_of_no_ones_choosing_leave_a_whole_snapshot(
    previous, warehouse, publisher, snapshot_path, tmp_path
):
    """No hook: the child publishes in a loop and is killed partway through one, in its
    refresh (a statement, the staging checkpoint) or its copy (the copy, the flush, the
    rename), wherever the moment falls. More images make the copy a wider target."""
    add_thumbnails(warehouse, "more", LOOP_THUMBNAILS)
    latest = pipeline_totals(warehouse)
    for round_, (phase, fraction) in enumerate(KILL_MOMENTS):
        log = tmp_path / f"child{round_}.log"
        with log.open("wb") as stderr:
            child = subprocess.Popen(
                child_command(warehouse, snapshot_path, "loop"),
                cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
            )
        try:
            # The first publish of a child may carry changes; the second is as the next.
            for _ in range(2):
                assert read_line(child.stdout, 60) == "start", log.read_text()
                said = read_line(child.stdout, 60)
                assert said.startswith("published "), (said, log.read_text())
            refresh, copy = (float(part) for part in said.split()[1:])
            assert read_line(child.stdout, 60) == "start", log.read_text()
            time.sleep(fraction * refresh if phase == "refresh" else refresh + fraction * copy)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL, log.read_text()
        assert snapshot_totals(snapshot_path, own_process=False)[:9] == latest
    assert_next_publish_equals_pipeline(warehouse, publisher, snapshot_path, owed=None)
