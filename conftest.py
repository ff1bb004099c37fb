"""How the suite runs: the long end-to-end tests first, the rest in any order asked for.

Here, at the root, so that `--shuffle-seed N` is known however pytest is invoked.
"""

from __future__ import annotations

import random

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle-seed",
        type=int,
        default=None,
        help="run the tests in an order shuffled by this seed (the suite may not depend on"
        " its order); the end-to-end tests still start first",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The minutes-long end-to-end tests first, each followed by one short test, then the
    other slow tests (the other end-to-end ones first), then the rest.

    Under `-n 3 --maxschedchunk 1`, xdist hands each worker two consecutive tests to start
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
