"""When Meta's usage holds one account, and for how long: only on the account's own share."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rastro_assets.meta.limits import account_hold
from rastro_assets.meta.models import Usage


@pytest.mark.parametrize(
    ("usage", "held"),
    [
        # The app's share is every token's together: it slows requests, never holds one account.
        (Usage(pct=99.0, app_pct=99.0, account_pct=12.0, reset_seconds=200), None),
        (Usage(pct=89.9, account_pct=89.9, reset_seconds=200), None),
        # At 90 % of its own share: max(regain, reset, 60 s).
        (Usage(pct=92.0, account_pct=92.0, reset_seconds=20), timedelta(seconds=60)),
        (Usage(pct=95.0, account_pct=95.0, reset_seconds=300), timedelta(seconds=300)),
        (Usage(pct=100.0, account_pct=100.0, regain_seconds=1_800, reset_seconds=300),
         timedelta(minutes=30)),
        # A wait Meta announced is the account's own limit speaking, whatever shares were read.
        (Usage(pct=100.0, regain_seconds=600), timedelta(minutes=10)),
    ],
)
def test_only_the_accounts_own_share_holds_it(usage, held):
    assert account_hold(usage) == held
