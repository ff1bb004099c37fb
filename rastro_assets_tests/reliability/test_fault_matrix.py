"""Every failure the fake Graph can inject, at every point a sync touches Meta.

Each case: a good sync of a week, then Meta changes every day of it (a figure
moves, an ad-day is withdrawn, one appears), then a sync meets the failure.
It must end with its classified outcome (or recover within the same sync, for
too much data and transient trouble); a day it read completely equals Meta,
a day it did not read completely keeps what it had; and after the failure is
cleared (and the token reconnected) the next sync equals Meta everywhere.

Spend failures are injected mid-sync (`skip`), after some chunks were already
written, so a failure that ends the sync proves that what came before stays
and what came after is untouched. Runs in-process with sleeps injected, on
DuckDB in full and on PostgreSQL over a subset (`POSTGRES_SPEND`, `POSTGRES_CATALOG`).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pytest

from rastro_assets.planner.runs import runs_by_account
from rastro_assets.sync.syncer import Syncer
from rastro_assets.sync.types import SyncOutcome, SyncRequest
from rastro_assets.timekeeping import days_between
from rastro_assets.vault import ENV_VAR, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.reliability.helpers import (
    build_world,
    client_factory,
    copy_schema,
    link_world,
    open_warehouse_of,
    perturb,
    spend_by_day,
    truth_by_day,
    warehouse_env_for,
)
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.world import (
    DEFAULT_ROW_CAP,
    FAILURES,
    TOKEN_SUBCODES,
    UNBOUNDED_FAULTS,
    FakeWorld,
    MutableClock,
)

ACCOUNT = "act_101"
TODAY = date(2026, 11, 30)  # Sao Paulo's date at the fixtures' NOW
SINCE, UNTIL = TODAY - timedelta(days=6), TODAY

TOKEN_ERRORS = ("token", *(f"token_{subcode}" for subcode in TOKEN_SUBCODES))
# Every throttling code classifies alike (meta/test_errors.py tries six); three here.
THROTTLE_ERRORS = ("throttled_4", "throttled_17", "throttled_80000")
# The app's own limit: every request waits out the app's pause and the read goes on.
APP_THROTTLE_ERRORS = ("throttled_4",)
PERMISSION_ERRORS = ("permission", "permission_10")
TOO_MUCH_ERRORS = ("too_much_data", "too_much_data_1504018", "too_much_data_1504038")
TRANSIENT_ERRORS = (
    "transient", "unknown_error", "http5xx_html", "http5xx_empty", "html_page", "malformed_json",
    "wrong_shape", "not_found", "timeout", "dropped",
)
OTHER_ERRORS = ("other",)
JOB_ERRORS = ("job_failed", "job_skipped", "job_stuck")
ERRORS = (
    TOKEN_ERRORS + THROTTLE_ERRORS + PERMISSION_ERRORS + TOO_MUCH_ERRORS + TRANSIENT_ERRORS
    + OTHER_ERRORS
)

SPEND_POINTS = ("insights", "insights_page", "async")
CATALOG_POINTS = ("ads", "thumbnail")
# Failures that persist until cleared, tried where they behave differently
# (a first page splits, an async job cannot, a listing cannot).
PERSISTENT_POINTS = ("insights", "async", "ads")

# Synchronous reads may hold this many rows: a week is read in chunks of
# about two days (the week, then its first half, are "too much").
CHUNKY_ROW_CAP = 20
# Matching requests let through before the failure, so it lands after the
# first chunk (insights, insights_page) or the first two days (async) were
# written. Checked by `test_the_failures_land_mid_sync`.
MID_SYNC_SKIP = {"insights": 3, "insights_page": 3, "async": 2, "ads": 1, "thumbnail": 0}


@dataclass(frozen=True)
class Expected:
    outcome: str  # ok | token | throttled | permission | other
    truncated: bool = False  # ok, with days left incomplete (META_TRUNCATED)


CODES = {
    "token": "META_TOKEN_INVALID",
    "throttled": "RATE_LIMITED",
    "permission": "META_PERMISSION",
    "other": "META_UNAVAILABLE",
}


def group(error: str) -> str:
    for name, members in (
        ("token", TOKEN_ERRORS),
        ("throttled", THROTTLE_ERRORS),
        ("permission", PERMISSION_ERRORS),
        ("too_much", TOO_MUCH_ERRORS),
        ("transient", TRANSIENT_ERRORS),
        ("other", OTHER_ERRORS),
        ("job", JOB_ERRORS),
    ):
        if error in members:
            return name
    raise AssertionError(f"{error} is in no group")


def expected_spend(point: str, error: str, persistent: bool) -> Expected:
    kind = group(error)
    if error in APP_THROTTLE_ERRORS and not persistent:
        return Expected("ok")
    if kind in ("token", "throttled", "permission", "other"):
        return Expected(kind)
    if kind == "job":
        return Expected("ok", truncated=True)
    if kind == "too_much":
        # Split down to days, then an async report; a report that cannot
        # even start leaves its day incomplete.
        return Expected("ok", truncated=point == "async")
    # Transient: retried. A timeout of a synchronous read means "too much"
    # (split, then async); anything else persisting is Meta being unavailable.
    if not persistent or (error == "timeout" and point != "async"):
        return Expected("ok")
    return Expected("other")


def expected_catalog(error: str, persistent: bool) -> str:
    kind = group(error)
    if error in APP_THROTTLE_ERRORS and not persistent:
        return "ok"
    if kind in ("token", "throttled", "permission", "other"):
        return kind
    if kind == "too_much":
        return "other"  # a catalog listing cannot be split
    return "other" if persistent else "ok"


def thumbnail_recovers(error: str) -> bool:
    """A CDN answer the client retries (5xx, 429, a broken connection)."""
    spec = FAILURES[error]
    return spec.fault is not None or spec.status >= 500 or spec.status == 429


# -- the run -------------------------------------------------------------------------

KEY = generate_key()  # seals the template warehouses' token

# The PostgreSQL variant runs a subset: each point with every way a sync can end there
# (failed mid-read, ok with days left incomplete, recovered by a retry or a split), the
# token's and a persistent failure's, and the catalog's listing and pictures. The
# statements a case runs depend on how the sync ends, not on which error code ended it.
POSTGRES_SPEND = {
    ("insights", "token", False), ("insights", "throttled_4", False),
    ("insights", "too_much_data", False), ("insights", "transient", False),
    ("insights", "other", False), ("insights", "transient", True),
    ("insights", "too_much_data", True), ("insights_page", "permission", False),
    ("insights_page", "timeout", False), ("async", "job_failed", False),
    ("async", "too_much_data", False), ("async", "throttled_17", False),
    ("async", "transient", True),
}
POSTGRES_CATALOG = {
    ("ads", "token", False), ("ads", "other", False), ("ads", "transient", True),
    ("thumbnail", "http5xx_html", False), ("thumbnail", "not_found", False),
}


def request(run_id: str, *, catalog: bool = False) -> SyncRequest:
    return SyncRequest(ACCOUNT, SINCE, UNTIL, kind="manual", run_id=run_id, catalog=catalog)


class Templates:
    """Warehouses after a good sync of the week (without, with the catalog), one of each per
    engine, built when first asked for; each case writes to a copy of one.

    Migrating, linking and the first sync would otherwise cost more than the case itself.
    """

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        self.root, self.request = root, request
        self.built: dict[tuple[str, bool], Warehouse | PostgresWarehouse] = {}

    def template(self, engine: str, catalog: bool) -> Warehouse | PostgresWarehouse:
        if (engine, catalog) not in self.built:
            env = warehouse_env_for(
                engine, self.root / f"{engine}-catalog-{catalog}" / "rastro.duckdb",
                self.request.getfixturevalue("warehouse_server") if engine == "postgres" else None,
            )
            warehouse = open_warehouse_of(env)
            warehouse.migrate()
            vault = Vault.from_env({ENV_VAR: KEY})
            clock = MutableClock(NOW)
            world = build_world(clock, TOKEN)
            link_world(warehouse, vault, world, TOKEN, NOW)
            syncer = Syncer(warehouse, client_factory(world), vault_factory=lambda: vault,
                            clock=clock)
            first = syncer.sync(request("good", catalog=catalog))
            assert first.ok and first.catalog_error is None, (first.error, first.catalog_error)
            self.built[engine, catalog] = warehouse
        return self.built[engine, catalog]

    def copy(self, engine: str, catalog: bool, tmp_path: Path) -> Warehouse | PostgresWarehouse:
        template = self.template(engine, catalog)
        if engine == "postgres":
            return PostgresWarehouse(
                copy_schema(self.request.getfixturevalue("warehouse_server"), template)
            )
        path = Path(template.path)
        shutil.copytree(path.parent, tmp_path / "data")
        return Warehouse(tmp_path / "data" / path.name, lock_wait_seconds=5.0)

    def close(self) -> None:
        for warehouse in self.built.values():
            if warehouse.engine == "postgres":
                warehouse.close()


@pytest.fixture(scope="module")
def templates(tmp_path_factory, request) -> Iterator[Templates]:
    built = Templates(tmp_path_factory.mktemp("templates"), request)
    yield built
    built.close()


@dataclass
class Case:
    world: FakeWorld
    warehouse: Warehouse
    syncer: Syncer
    clock: MutableClock
    vault: Vault


@contextmanager
def case_from(templates: Templates, engine: str, catalog: bool, tmp_path: Path) -> Iterator[Case]:
    """A copy of a template (a DuckDB file held open for the case), a fresh world."""
    warehouse = templates.copy(engine, catalog, tmp_path)
    vault = Vault.from_env({ENV_VAR: KEY})
    clock = MutableClock(NOW)
    world = build_world(clock, TOKEN)
    syncer = Syncer(warehouse, client_factory(world), vault_factory=lambda: vault, clock=clock)
    try:
        with warehouse.held():
            yield Case(world, warehouse, syncer, clock, vault)
    finally:
        if warehouse.engine == "postgres":
            warehouse.close()


def recover(case: Case) -> None:
    """The failure cleared; a token marked invalid is connected again."""
    case.world.clear_failures()
    case.world.row_cap = DEFAULT_ROW_CAP
    case.world.revive_token(TOKEN)
    with case.warehouse.connect() as con:
        connection = registry.get_connection(con, "c1")
        if connection.status != "active":
            case.clock.advance(seconds=1)  # a new seal is a new token version
            registry.save_connection(con, "c1", case.vault.seal("c1", TOKEN), case.clock())


def assert_days_kept_or_replaced(
    outcome: SyncOutcome, before: dict, after: dict, truth: dict
) -> None:
    complete, incomplete = set(outcome.complete_days), set(outcome.incomplete_days)
    for day in days_between(SINCE, UNTIL):
        if day in complete:
            assert after[day] == truth[day], f"{day} was read completely but differs from Meta"
        elif day in incomplete:
            kept = {row[0] for row in after[day]}
            assert {row[0] for row in before[day]} <= kept, f"{day}: an old row was dropped"
            assert after[day] <= before[day] | truth[day], f"{day}: a row from nowhere"
        else:
            assert after[day] == before[day], f"{day} was not read but changed"
        assert before[day] != truth[day], f"{day}: the perturbation changed nothing"


def assert_run_recorded(warehouse, outcome: SyncOutcome) -> None:
    with warehouse.connect() as con:
        runs = {run.run_id: run for run in runs_by_account(sync_run_rows(con))[ACCOUNT]}
    run = runs[outcome.request.run_id]
    assert run.finished_at is not None
    assert (run.outcome, run.error) == (outcome.outcome, outcome.error)
    assert set(run.incomplete_days) == set(outcome.incomplete_days)


def catalog_state(warehouse) -> dict[str, tuple]:
    with warehouse.connect() as con:
        rows = con.execute(
            "SELECT ad_id, ad_name, ad_status, creative_type, creative_id FROM ad_catalog"
            " WHERE ad_account_id = ?",
            [ACCOUNT],
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def thumbnail_state(warehouse) -> dict[str, tuple]:
    with warehouse.connect() as con:
        rows = con.execute("SELECT ad_id, creative_id, sha256 FROM ad_thumbnails").fetchall()
    return {row[0]: row[1:] for row in rows}


def assert_catalog_equals_meta(warehouse, world) -> None:
    kinds = {"video": "video", "image": "image", "photo": "image", "carousel": "carousel",
             "other": "other"}
    ads = world.accounts[ACCOUNT].ads
    assert catalog_state(warehouse) == {
        ad.ad_id: (ad.name, ad.effective_status, kinds[ad.creative_kind], ad.creative_id)
        for ad in ads.values()
    }
    assert thumbnail_state(warehouse) == {
        ad.ad_id: (ad.creative_id, hashlib.sha256(world.thumbnail_bytes(ad.ad_id)).hexdigest())
        for ad in ads.values()
        if world.has_thumbnail(ad)
    }


def change_catalog(world) -> list[str]:
    """A rename, a status change and three new creatives; the ads with a new picture."""
    ads = sorted(world.accounts[ACCOUNT].ads)
    world.set_ad(ads[0], name="Renomeado ☀️ depois")
    world.set_ad(ads[1], effective_status="PAUSED")
    fresh = [ad_id for ad_id in ads[2:] if world.has_thumbnail(world.ad(ad_id))][:3]
    for ad_id in fresh:
        world.set_ad(ad_id, new_creative=True)
    return fresh


# -- the matrix -------------------------------------------------------------------------


def postgres_subset(cases, chosen: set[tuple]) -> list:
    picked = [case for case in cases if tuple(case.values) in chosen]
    assert len(picked) == len(chosen), "a PostgreSQL case is not in the matrix"
    return picked


def spend_cases():
    for point in SPEND_POINTS:
        for error in ERRORS + (JOB_ERRORS if point == "async" else ()):
            yield pytest.param(point, error, False, id=f"{point}-{error}")
        if point in PERSISTENT_POINTS:
            for error in TOO_MUCH_ERRORS + TRANSIENT_ERRORS:
                yield pytest.param(point, error, True, id=f"{point}-{error}-persistent")


@pytest.mark.engines("duckdb")
@pytest.mark.parametrize(("point", "error", "persistent"), spend_cases())
def test_spend_fault(point, error, persistent, engine, templates, tmp_path):
    spend_fault(point, error, persistent, engine, templates, tmp_path)


@pytest.mark.engines("postgres")
@pytest.mark.parametrize(("point", "error", "persistent"), postgres_subset(
    spend_cases(), POSTGRES_SPEND))
def test_spend_fault_on_postgres(point, error, persistent, engine, templates, tmp_path):
    spend_fault(point, error, persistent, engine, templates, tmp_path)


def spend_fault(point, error, persistent, engine, templates, tmp_path) -> None:
    with case_from(templates, engine, False, tmp_path) as case:
        world, warehouse = case.world, case.warehouse
        perturb(world, ACCOUNT, SINCE, UNTIL)
        with warehouse.connect() as con:
            before = spend_by_day(con, ACCOUNT, SINCE, UNTIL)
        truth = truth_by_day(world, ACCOUNT, SINCE, UNTIL)

        # async: every multi-row day is too much for a synchronous read.
        world.row_cap = 1 if point == "async" else CHUNKY_ROW_CAP
        world.fail(point, error, times=None if persistent else 1, account=ACCOUNT,
                   skip=0 if persistent else MID_SYNC_SKIP[point])
        outcome = case.syncer.sync(request("faulty"))

        want = expected_spend(point, error, persistent)
        assert outcome.outcome == want.outcome, outcome.error
        if want.outcome != "ok":
            assert outcome.error.startswith(CODES[want.outcome] + ": "), outcome.error
            assert outcome.unread_days, "a failed sync says which days it did not read"
            if want.outcome == "throttled":
                assert outcome.regain_at is not None and outcome.regain_at > case.clock()
        elif want.truncated:
            assert outcome.incomplete_days and outcome.error.startswith("META_TRUNCATED: ")
        else:
            assert outcome.error is None
            assert outcome.complete_days == list(days_between(SINCE, UNTIL))
        assert TOKEN not in (outcome.error or "")
        with warehouse.connect() as con:
            after = spend_by_day(con, ACCOUNT, SINCE, UNTIL)
            assert_site_spend_exact(con)
            connection = registry.get_connection(con, "c1")
        assert_days_kept_or_replaced(outcome, before, after, truth)
        assert_run_recorded(warehouse, outcome)
        assert connection.status == ("invalid" if want.outcome == "token" else "active")

        recover(case)
        again = case.syncer.sync(request("recovered"))
        assert (again.outcome, again.error) == ("ok", None)
        with warehouse.connect() as con:
            assert_equals_truth(con, world, ACCOUNT, SINCE, UNTIL)
            assert_site_spend_exact(con)


def catalog_cases():
    for point in CATALOG_POINTS:
        for error in ERRORS:
            yield pytest.param(point, error, False, id=f"{point}-{error}")
        if point in PERSISTENT_POINTS:
            for error in TRANSIENT_ERRORS:
                yield pytest.param(point, error, True, id=f"{point}-{error}-persistent")


@pytest.mark.engines("duckdb")
@pytest.mark.parametrize(("point", "error", "persistent"), catalog_cases())
def test_catalog_fault(point, error, persistent, engine, templates, tmp_path):
    catalog_fault(point, error, persistent, engine, templates, tmp_path)


@pytest.mark.engines("postgres")
@pytest.mark.parametrize(("point", "error", "persistent"), postgres_subset(
    catalog_cases(), POSTGRES_CATALOG))
def test_catalog_fault_on_postgres(point, error, persistent, engine, templates, tmp_path):
    catalog_fault(point, error, persistent, engine, templates, tmp_path)


def catalog_fault(point, error, persistent, engine, templates, tmp_path) -> None:
    with case_from(templates, engine, True, tmp_path) as case:
        world, warehouse = case.world, case.warehouse
        assert_catalog_equals_meta(warehouse, world)
        fresh = change_catalog(world)
        perturb(world, ACCOUNT, SINCE, UNTIL)
        catalog_before, thumbnails_before = catalog_state(warehouse), thumbnail_state(warehouse)

        world.fail(point, error, times=None if persistent else 1,
                   account=ACCOUNT if point == "ads" else None,
                   skip=0 if persistent else MID_SYNC_SKIP[point])
        outcome = case.syncer.sync(request("faulty", catalog=True))

        # The catalog comes after the spend: whatever it meets, the spend is written. A full
        # read that fails is the run's failure (retried after its back-off); a picture is not.
        want_run = expected_catalog(error, persistent) if point == "ads" else "ok"
        assert outcome.outcome == want_run
        assert outcome.error == (None if want_run == "ok" else outcome.catalog_error)
        with warehouse.connect() as con:
            assert_equals_truth(con, world, ACCOUNT, SINCE, UNTIL)
            assert_site_spend_exact(con)
            connection = registry.get_connection(con, "c1")
        catalog_after, thumbnails_after = catalog_state(warehouse), thumbnail_state(warehouse)
        if point == "ads":
            want = expected_catalog(error, persistent)
            assert outcome.catalog.outcome == want, outcome.catalog_error
            if want == "ok":
                assert outcome.catalog_error is None
                assert_catalog_equals_meta(warehouse, world)
            else:
                assert outcome.catalog_error.startswith(CODES[want] + ": ")
                assert outcome.thumbnails is None
                assert thumbnails_after == thumbnails_before
                # Statuses and creatives come only from the listing: untouched.
                assert {ad: row[1:] for ad, row in catalog_after.items()} == {
                    ad: row[1:] for ad, row in catalog_before.items()
                }
            assert connection.status == ("invalid" if want == "token" else "active")
        else:
            assert outcome.catalog.ok
            pictures = outcome.thumbnails
            assert pictures is not None and pictures.ok and pictures.wanted == len(fresh)
            # Persisting, every picture fails; once, one fails unless the client retries it.
            once = 0 if thumbnail_recovers(error) else 1
            failed = len(fresh) if persistent else once
            assert (pictures.failed, pictures.fetched) == (failed, len(fresh) - failed)
            assert len(pictures.failures) == failed
            assert all("sig=" not in note and TOKEN not in note for note in pictures.failures)
            stale = [ad for ad in fresh if thumbnails_after[ad] == thumbnails_before[ad]]
            assert len(stale) == failed
            assert {ad: row for ad, row in thumbnails_after.items() if ad not in fresh} == {
                ad: row for ad, row in thumbnails_before.items() if ad not in fresh
            }
            assert connection.status == "active"

        recover(case)
        again = case.syncer.sync(request("recovered", catalog=True))
        assert (again.outcome, again.error, again.catalog_error) == ("ok", None, None)
        assert_catalog_equals_meta(warehouse, world)
        with warehouse.connect() as con:
            assert_equals_truth(con, world, ACCOUNT, SINCE, UNTIL)


# -- the matrix covers the fake, and its failures land where they should ---------------


def test_every_failure_of_the_fake_is_in_the_matrix():
    aliases = {"throttled", "permission_200"}
    throttles = {name for name in FAILURES if name.startswith("throttled_")}
    # Staged only where a person waits on an account listing: meta/test_bounds.py.
    listing_only = {name for name, spec in FAILURES.items() if spec.fault in UNBOUNDED_FAULTS}
    covered = set(ERRORS) | set(JOB_ERRORS) | throttles | aliases | listing_only
    assert set(FAILURES) <= covered, sorted(set(FAILURES) - covered)
    assert set(THROTTLE_ERRORS) <= throttles


@pytest.mark.engines("duckdb", "postgres")
@pytest.mark.parametrize("point", SPEND_POINTS)
def test_the_failures_land_mid_sync(point, engine, templates, tmp_path):
    """A failure that ends the sync comes after some days were written, before others."""
    with case_from(templates, engine, False, tmp_path) as case:
        perturb(case.world, ACCOUNT, SINCE, UNTIL)
        case.world.row_cap = 1 if point == "async" else CHUNKY_ROW_CAP
        case.world.fail(point, "permission", account=ACCOUNT, skip=MID_SYNC_SKIP[point])
        outcome = case.syncer.sync(request("faulty"))
        assert outcome.outcome == "permission"
        assert outcome.complete_days and outcome.unread_days, (
            outcome.complete_days, outcome.unread_days
        )
