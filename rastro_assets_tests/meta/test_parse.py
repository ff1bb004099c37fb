"""Meta's ad and account nodes into typed values: creative kinds, required fields."""

from __future__ import annotations

import pytest

from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.parse import creative_type, parse_account, parse_ad


@pytest.mark.parametrize(("creative", "kind"), [
    ({"video_id": "1"}, "video"),
    ({"object_story_spec": {"video_data": {"video_id": "1"}}}, "video"),
    ({"object_story_spec": {"link_data": {"child_attachments": [{}]}}, "image_url": "u"},
     "carousel"),
    ({"image_url": "u"}, "image"),
    ({"object_type": "PHOTO"}, "image"),
    ({"object_type": "STATUS", "asset_feed_spec": {}}, "other"),
    (None, None),
])
def test_creative_types(creative, kind) -> None:
    assert creative_type(creative) == kind


def test_ad_and_account_parsing() -> None:
    ad = parse_ad({"id": "5", "name": "n", "adset": {"name": "s"}, "campaign": {"name": "c"},
                   "account_id": "77", "creative": {"id": "9", "thumbnail_url": "https://x/y"}})
    assert (ad.ad_account_id, ad.adset_name, ad.campaign_name, ad.creative_id) == (
        "act_77", "s", "c", "9")
    with pytest.raises(MalformedResponse):
        parse_ad({"name": "no id"})
    account = parse_account({"currency": "JPY", "timezone_name": "Asia/Tokyo",
                             "account_status": 1}, "act_1")
    assert (account.currency, account.timezone, account.account_status) == (
        "JPY", "Asia/Tokyo", 1)
    with pytest.raises(MalformedResponse):
        parse_account({"currency": "JPY"}, "act_1")
