"""The code location by convention: what each shard count defines, that shard 0 differs from
the others only in its names, that a module offering `shard_defs` or `location_defs` is
picked up wherever it is dropped, and that no definition is built when a module is imported."""

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

import rastro_assets
import rastro_assets.defs
from rastro_assets import shards
from rastro_assets.definitions import ROOTS, build_defs, domains, shard_defs

SPEND_DATES = "date"

ONE_SHARD = {
    "assets": {
        "ad_catalog": ("meta_catalog", ("meta_ad_account",), None),
        "ad_spend_daily": ("meta_spend", ("meta_ad_account", SPEND_DATES), None),
        "ad_thumbnails": ("meta_catalog", ("meta_ad_account",), None),
        "analytics_snapshot": ("analytics", (), None),
        "lead_daily_rollups": ("registry", (), None),
        "meta_account_health": ("meta_spend", (), None),
        "meta_ad_accounts": ("registry", (), None),
        "meta_connections": ("registry", (), None),
        "site_ad_accounts": ("registry", (), None),
        "site_spend_daily": ("meta_spend", ("meta_ad_account", SPEND_DATES), None),
        "sites": ("registry", (), None),
        "spend_backfill": ("meta_spend", ("meta_ad_account",), None),
    },
    "checks": [
        "ad_spend_daily:accounts_fresh",
        "meta_account_health:no_open_incidents",
        "site_spend_daily:equals_sum_of_ad_spend",
    ],
    "sensors": {
        "analytics_publisher": ["publish_analytics_snapshot"],
        "meta_accounts": [],
        "meta_cadence": [
            "meta_account_health_refresh", "meta_catalog_sync", "meta_spend_sync",
            "meta_sync_wave",
        ],
        "meta_incidents": [],
        "meta_records": [],
        "retention": [],
    },
    "jobs": [
        "meta_account_health_refresh", "meta_catalog_sync", "meta_spend_sync", "meta_sync_wave",
        "publish_analytics_snapshot",
    ],
}

THREE_SHARDS = {
    "assets": {
        "ad_catalog": ("meta_catalog", ("meta_ad_account_all",), None),
        "ad_spend_daily": ("meta_spend", ("meta_ad_account", SPEND_DATES), 0),
        "ad_spend_daily_shard_1": (
            "meta_spend_shard_1", ("meta_ad_account_shard_1", SPEND_DATES), 1
        ),
        "ad_spend_daily_shard_2": (
            "meta_spend_shard_2", ("meta_ad_account_shard_2", SPEND_DATES), 2
        ),
        "ad_thumbnails": ("meta_catalog", ("meta_ad_account_all",), None),
        "analytics_snapshot": ("analytics", (), None),
        "lead_daily_rollups": ("registry", (), None),
        "meta_account_health": ("meta_spend", (), None),
        "meta_ad_accounts": ("registry", (), None),
        "meta_connections": ("registry", (), None),
        "site_ad_accounts": ("registry", (), None),
        "site_spend_daily": ("meta_spend", ("meta_ad_account", SPEND_DATES), 0),
        "site_spend_daily_shard_1": (
            "meta_spend_shard_1", ("meta_ad_account_shard_1", SPEND_DATES), 1
        ),
        "site_spend_daily_shard_2": (
            "meta_spend_shard_2", ("meta_ad_account_shard_2", SPEND_DATES), 2
        ),
        "sites": ("registry", (), None),
        "spend_backfill": ("meta_spend", ("meta_ad_account",), 0),
        "spend_backfill_shard_1": ("meta_spend_shard_1", ("meta_ad_account_shard_1",), 1),
        "spend_backfill_shard_2": ("meta_spend_shard_2", ("meta_ad_account_shard_2",), 2),
    },
    "checks": [
        "ad_spend_daily:accounts_fresh",
        "ad_spend_daily_shard_1:accounts_fresh",
        "ad_spend_daily_shard_2:accounts_fresh",
        "meta_account_health:no_open_incidents",
        "site_spend_daily:equals_sum_of_ad_spend",
        "site_spend_daily_shard_1:equals_sum_of_ad_spend",
        "site_spend_daily_shard_2:equals_sum_of_ad_spend",
    ],
    "sensors": {
        "analytics_publisher": ["publish_analytics_snapshot"],
        "meta_accounts": [],
        "meta_cadence": [
            "meta_account_health_refresh", "meta_catalog_sync", "meta_spend_shard_1_sync",
            "meta_spend_shard_2_sync", "meta_spend_sync", "meta_sync_wave",
        ],
        "meta_incidents": [],
        "meta_records": [],
        "retention": [],
    },
    "jobs": [
        "meta_account_health_refresh", "meta_catalog_sync", "meta_spend_shard_1_sync",
        "meta_spend_shard_2_sync", "meta_spend_sync", "meta_sync_wave",
        "publish_analytics_snapshot",
    ],
}


def _partitions(partitions_def) -> tuple[str, ...]:
    """The dynamic sets a partitions definition is made of, and `date` for the date axis."""
    if partitions_def is None:
        return ()
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return tuple(
            name for dim in partitions_def.partitions_defs
            for name in _partitions(dim.partitions_def) or (dim.name,)
        )
    if isinstance(partitions_def, dg.DynamicPartitionsDefinition):
        return (partitions_def.name,)
    return ()


def summary(defs: dg.Definitions) -> dict:
    """What an operator and the docs know the location by: asset keys with their group,
    partitions and shard, check keys, jobs, and sensors with the jobs they target."""
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    assets = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        shard = node.metadata.get("rastro/shard")
        assets[key.to_user_string()] = (
            node.group_name,
            _partitions(node.partitions_def),
            getattr(shard, "value", shard),
        )
    return {
        "assets": assets,
        "checks": sorted(
            f"{check.asset_key.to_user_string()}:{check.name}" for check in graph.asset_check_keys
        ),
        "sensors": {
            sensor.name: sorted(t.job_name for t in sensor.targets) if sensor.has_jobs else []
            for sensor in repo.sensor_defs
        },
        "jobs": sorted(job.name for job in repo.get_all_jobs() if not job.name.startswith("__")),
    }


@pytest.mark.parametrize(("shard_count", "expected"), [(1, ONE_SHARD), (3, THREE_SHARDS)])
def test_the_location_defines_what_operators_and_the_docs_know(shard_count, expected):
    assert summary(build_defs(shard_count)) == expected


def test_shard_0_differs_from_the_others_only_in_its_names():
    def names(defs: dg.Definitions, shard: int) -> dict:
        plain = {}
        for asset in defs.assets:
            for spec in asset.specs:
                # Shard k's names are shard 0's with the shard's suffix.
                base = spec.key.to_user_string().removesuffix(shards.suffix(shard))
                plain[base] = (
                    spec.group_name.removesuffix(shards.suffix(shard)),
                    sorted(dep.asset_key.to_user_string().removesuffix(shards.suffix(shard))
                           for dep in spec.deps),
                    spec.description.split(" Shard ")[0],
                    spec.tags,
                    sorted(spec.kinds),
                )
        checks = sorted(
            f"{key.asset_key.to_user_string().removesuffix(shards.suffix(shard))}:{key.name}"
            for check in defs.asset_checks for key in check.check_keys
        )
        return {"assets": plain, "checks": checks, "sensors": defs.sensors, "jobs": defs.jobs}

    first, second, third = (shard_defs(shard, 3) for shard in range(3))
    assert names(first, 0) == names(second, 1) == names(third, 2)
    assert names(first, 0)["assets"].keys() == {"ad_spend_daily", "site_spend_daily",
                                                "spend_backfill"}


def test_no_definition_is_built_when_a_module_is_imported():
    unresolved_job = type(dg.define_asset_job("any"))
    definitions = (
        dg.AssetsDefinition, dg.AssetSpec, dg.AssetChecksDefinition, dg.SensorDefinition,
        dg.ScheduleDefinition, dg.JobDefinition, unresolved_job, dg.Definitions,
    )
    built = []
    for info in pkgutil.walk_packages(rastro_assets.defs.__path__, "rastro_assets.defs."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            values = value if type(value) in (list, tuple) else [value]
            if any(isinstance(each, definitions) for each in values):
                built.append(f"{info.name}.{name}")
    assert built == []


def _domain_module(group: str) -> str:
    """A module offering one per-shard asset and one asset the location has once."""
    return textwrap.dedent(
        f"""
        import dagster as dg

        from rastro_assets import shards


        def shard_defs(shard, shard_count):
            @dg.asset(
                key=shards.named("spend_reach", shard),
                group_name=shards.named("{group}", shard),
                metadata={{"shards": shard_count}},
            )
            def spend_reach():
                return None

            return dg.Definitions(assets=[spend_reach])


        def location_defs(shard_count):
            return dg.Definitions(assets=[dg.AssetSpec("reach_overview")])
        """
    )


@pytest.fixture
def extra_domains(tmp_path, monkeypatch):
    """A package outside the product holding one domain module, importable by its name."""
    package = f"extra_domains_{tmp_path.name.replace('-', '_')}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "reach.py").write_text(_domain_module("meta_spend"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(package)
    for name in [name for name in sys.modules if name.startswith(package)]:
        del sys.modules[name]


def test_a_per_shard_asset_added_in_one_file_appears_in_every_shard(extra_domains):
    roots = (*ROOTS, extra_domains)
    assert f"{extra_domains.__name__}.reach" in [module.__name__ for module in domains(roots)]

    location = summary(build_defs(3, roots))

    for shard in range(3):
        reach = shards.named("spend_reach", shard)
        assert location["assets"][reach] == (shards.named("meta_spend", shard), (), None)
        assert shards.ad_spend_name(shard) in location["assets"]
    assert "reach_overview" in location["assets"]
    [reach] = shard_defs(2, 3, roots=(extra_domains,)).assets
    assert reach.key == dg.AssetKey("spend_reach_shard_2")
    assert reach.specs_by_key[reach.key].metadata == {"shards": 3}


@pytest.mark.slow
def test_a_module_dropped_into_defs_is_loaded_by_the_code_location(tmp_path):
    """The code location as Dagster loads it (`rastro_assets.definitions`, in a process of
    its own with `RASTRO_ACCOUNT_SHARDS=2`) holds a module dropped into a domain's folder,
    with `definitions.py` untouched."""
    product = Path(rastro_assets.__file__).parent
    copy = tmp_path / "rastro_assets"
    shutil.copytree(product, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert (copy / "definitions.py").read_bytes() == (product / "definitions.py").read_bytes()
    (copy / "defs" / "spend" / "reach.py").write_text(_domain_module("meta_spend"))
    script = (
        "import rastro_assets.definitions as location\n"
        "print(location.__file__)\n"
        "print(sorted(k.to_user_string() for k in"
        " location.defs.get_repository_def().asset_graph.get_all_asset_keys()))\n"
    )
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "RASTRO_ACCOUNT_SHARDS": "2",
    }
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )
    where, keys = done.stdout.splitlines()
    assert where == str(copy / "definitions.py")
    for key in ("spend_reach", "spend_reach_shard_1", "reach_overview", "ad_spend_daily_shard_1"):
        assert f"'{key}'" in keys
