"""Worlds for the reliability tests: a bigger act_101 and a Syncer that never waits.

`fake_world` is overridden here, so `linked_world`, `fake_graph` and the
package's syncers see twelve ads in act_101: enough rows that a week is read
in several chunks and pages.
"""

from __future__ import annotations

import pytest

from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.reliability.helpers import build_world, make_syncer


@pytest.fixture
def fake_world(fake_clock):
    """act_101 (Sao Paulo, BRL, 12 ads) and act_202 (Tokyo, JPY, 4 ads), read by TOKEN."""
    return build_world(fake_clock, TOKEN)


@pytest.fixture
def rsyncer(warehouse, linked_world, fake_clock, secrets_key):
    """A Syncer on the fake in-process: 4 rows a page, retries and polls without sleeping."""
    return make_syncer(warehouse, linked_world, fake_clock)
