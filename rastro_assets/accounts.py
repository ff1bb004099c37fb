"""The one rule of an ad account id: `act_<digits>`, also given as bare digits.

The CLI, the registry, the Dagster partitions and the Meta client all take an
account id from outside; each normalizes it here so every table, partition key
and Graph path spells one account one way.
"""

from __future__ import annotations

import re

# ASCII digits only: `\d` would let other scripts' digits through to Meta and DuckDB.
_ACCOUNT_ID = re.compile(r"(?:act_)?([0-9]+)")


def normalize_account_id(raw: str) -> str:
    """`act_<digits>` or bare digits, as `act_<digits>`; ValueError otherwise."""
    text = raw.strip() if isinstance(raw, str) else ""
    match = _ACCOUNT_ID.fullmatch(text)
    if match is None:
        raise ValueError(
            f"ad account id {raw!r} is not act_<digits> or bare digits (for example act_1234567890)"
        )
    return f"act_{match[1]}"
