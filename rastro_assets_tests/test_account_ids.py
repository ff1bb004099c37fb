"""The one ad account id rule: what it accepts, how it spells it, and how it refuses."""

from __future__ import annotations

import pytest

from rastro_assets.account_ids import normalize_account_id


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("act_123", "act_123"), ("123", "act_123"), (" act_9 ", "act_9"), ("0042", "act_0042")],
)
def test_account_ids_normalize(raw: str, expected: str):
    assert normalize_account_id(raw) == expected


@pytest.mark.parametrize(
    "raw", ["", " ", "act_", "act_12|2026-11-30", "act_1 2", "ACT_1", "act_-1", "1.5", "act_1x"]
)
def test_bad_account_ids_are_refused(raw: str):
    with pytest.raises(ValueError, match="is not act_<digits> or bare digits"):
        normalize_account_id(raw)


@pytest.mark.parametrize("raw", [123, None, b"act_1", "act_١٢٣", "１２３"])
def test_only_ascii_digit_text_is_an_account_id(raw: object):
    with pytest.raises(ValueError, match=r"\(for example act_1234567890\)"):
        normalize_account_id(raw)  # type: ignore[arg-type]


def test_the_refusal_names_what_was_given():
    with pytest.raises(ValueError, match=r"^ad account id 'act_x' is not act_<digits>"):
        normalize_account_id("act_x")
