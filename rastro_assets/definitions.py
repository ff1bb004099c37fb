"""The code location: every domain's definitions under `defs/`, merged over the shards.

What a domain offers, and how it is found, is the convention in `defs/__init__`'s
docstring: a module under `rastro_assets.defs` defining `shard_defs(shard, shard_count)`
or `location_defs(shard_count)`. This module only finds them, merges them, and applies
what holds for the whole location (the `rastro` resource, the in-process executor).

Dagster's own loader (`dg.load_from_defs_folder`) does not fit the shards: it imports every
module of a defs folder and takes a module-level `Definitions` object or `@dg.definitions`
functions, called with a load context and no arguments, and otherwise every module-level
asset, check, sensor and job. Definitions built per shard need the shard and the shard
count as arguments, and module-level objects are the import-time singletons that made
shard 0 a case of its own. The merge is Dagster's (`dg.Definitions.merge`).
"""

import importlib
import pkgutil
from collections.abc import Sequence
from types import ModuleType

import dagster as dg

import rastro_assets.defs
from rastro_assets.defs.partitions import configured_shard_count
from rastro_assets.defs.resources import RastroResource

SHARD_DEFS = "shard_defs"
LOCATION_DEFS = "location_defs"
ROOTS = (rastro_assets.defs,)


def domains(roots: Sequence[ModuleType] = ROOTS) -> list[ModuleType]:
    """Every module under the `roots` packages (at any depth) that defines `shard_defs` or
    `location_defs` itself, in name order."""
    found = []
    for root in roots:
        for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
            module = importlib.import_module(info.name)
            if _own(module, SHARD_DEFS) or _own(module, LOCATION_DEFS):
                found.append(module)
    return sorted(found, key=lambda module: module.__name__)


def _own(module: ModuleType, name: str) -> bool:
    # A factory imported from another module is that module's to offer, not this one's.
    factory = getattr(module, name, None)
    return callable(factory) and getattr(factory, "__module__", None) == module.__name__


def shard_defs(shard: int, shard_count: int, roots: Sequence[ModuleType] = ROOTS) -> dg.Definitions:
    """Every definition of shard `shard` of `shard_count`: each domain's `shard_defs`."""
    return _shard_defs(shard, shard_count, domains(roots))


def _shard_defs(shard: int, shard_count: int, found: list[ModuleType]) -> dg.Definitions:
    return dg.Definitions.merge(
        *(module.shard_defs(shard, shard_count) for module in found if _own(module, SHARD_DEFS))
    )


def build_defs(shard_count: int, roots: Sequence[ModuleType] = ROOTS) -> dg.Definitions:
    """The code location with `shard_count` shards: each domain's once-per-location
    definitions and every shard's, over one `rastro` resource and executor."""
    found = domains(roots)
    return dg.Definitions.merge(
        *(module.location_defs(shard_count) for module in found if _own(module, LOCATION_DEFS)),
        *(_shard_defs(shard, shard_count, found) for shard in range(shard_count)),
        dg.Definitions(
            resources={"rastro": RastroResource()},
            # Every run is one step's worth of work; a process per step would double its cost.
            executor=dg.in_process_executor,
        ),
    )


defs = build_defs(configured_shard_count())
