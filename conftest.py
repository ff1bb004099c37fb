"""How the suite runs: the long end-to-end tests first, the rest in any order asked for, the
tests' temporary directories in memory where the machine has room for them, and the code
compiled once for all the Python processes the suite starts.

Here, at the root, so that `--shuffle-seed N` is known however pytest is invoked.
"""

from __future__ import annotations

import compileall
import os
import py_compile
import random
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
COMPILED_PACKAGES = ("rastro_assets", "rastro_fake_graph")
"""Imported by nearly every process the tests start: the code servers, daemons, run workers
and `rastro` commands, in this checkout and in the end-to-end tests' copies of it."""

# An environment that asks Python not to write bytecode (PYTHONDONTWRITEBYTECODE) makes every
# xdist worker rewrite and compile each test module again, and every process the tests start
# compile the product again: on a machine the suite keeps busy, that CPU is its running time.
# A cache is not a change of behaviour, so the suite keeps one.
sys.dont_write_bytecode = False

MEMORY_TEMP_ROOT = Path("/dev/shm")
"""A RAM disk on Linux: Dagster's SQLite storages and the DuckDB files in the tests' directories
commit thousands of times in a run, and on a disk each commit waits for the disk while the
worker's core idles. A passing test's directory goes as it ends (pyproject's
`tmp_path_retention_policy`), so only the running tests' files take memory."""
MEMORY_TEMP_ROOM = 8 * 2**30
"""The room left on it below which the temporary directories stay where pytest puts them."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle-seed",
        type=int,
        default=None,
        help="run the tests in an order shuffled by this seed (the suite may not depend on"
        " its order); the end-to-end tests still start first",
    )


def pytest_configure(config: pytest.Config) -> None:
    """The product compiled (by the controller, before any worker starts), and the temporary
    directories under `MEMORY_TEMP_ROOT` unless a base was asked for."""
    if not hasattr(config, "workerinput"):
        compile_product()
    if config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return
    if memory_has_room(MEMORY_TEMP_ROOT):
        # pytest's own setting of the root its numbered `pytest-of-USER/pytest-N` go under;
        # the xdist workers are handed their directories below the controller's.
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(MEMORY_TEMP_ROOT)


def compile_product() -> None:
    """Bytecode for the product's modules, read by the processes the tests start even when
    their environment forbids writing it. Checked against each source's hash rather than its
    time, so a copy of the checkout (`e2e/demo_harness.copy_tracked_files`) may use it too,
    and an edited module is compiled afresh, never run stale."""
    for package in COMPILED_PACKAGES:
        compileall.compile_dir(
            ROOT / package, quiet=1,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )


def memory_has_room(root: Path) -> bool:
    if not (root.is_dir() and os.access(root, os.W_OK | os.X_OK)):
        return False
    return shutil.disk_usage(root).free >= MEMORY_TEMP_ROOM


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The minutes-long end-to-end tests first, each followed by one short test, then the
    other slow tests (the other end-to-end ones first), then the rest.

    Under `-n 4 --maxschedchunk 1`, xdist hands each worker two consecutive tests to start
    with, then one at a time: so each end-to-end test starts at once on a worker of its own
    while the short tests fill the time around them. Every worker collects and sorts alike:
    the seed, not the worker, picks the order.
    """
    seed = config.getoption("--shuffle-seed")
    if seed is not None:
        random.Random(seed).shuffle(items)
    long = [item for item in items if item.get_closest_marker("e2e")]
    slow = [item for item in items if item.get_closest_marker("slow") and item not in long]
    # The other end-to-end tests run a minute or two each: started before the shorter slow
    # ones, none of them is left running alone at the end.
    slow.sort(key=lambda item: "/e2e/" not in f"/{item.nodeid}")
    rest = [item for item in items if not item.get_closest_marker("slow")]
    ordered = []
    for item in long:
        ordered.append(item)
        if rest:
            ordered.append(rest.pop())
    items[:] = ordered + slow + rest
