"""Meta's catalog JSON (ads, ad accounts) into typed models.

Every check here raises `MalformedResponse` with a message naming the field,
never echoing a whole body. Insights pages are parsed in `insights_parse`,
Meta's error objects classified in `errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.models import Ad, AdAccount, CreativeType
from rastro_assets.meta.values import int_or_none, text


def _required_text(obj: Mapping[str, Any], key: str, what: str) -> str:
    value = obj.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise MalformedResponse(f"{what} has no {key!r}")
    return value


def creative_type(creative: Mapping[str, Any] | None) -> CreativeType | None:
    """The facts page's rule: video, then carousel, then image, else other."""
    if not isinstance(creative, Mapping):
        return None
    spec = creative.get("object_story_spec")
    spec = spec if isinstance(spec, Mapping) else {}
    link_data = spec.get("link_data")
    link_data = link_data if isinstance(link_data, Mapping) else {}
    if creative.get("video_id") or spec.get("video_data"):
        return "video"
    if link_data.get("child_attachments"):
        return "carousel"
    if creative.get("image_url") or creative.get("object_type") == "PHOTO":
        return "image"
    return "other"


def _nested_name(obj: Mapping[str, Any], key: str) -> str | None:
    inner = obj.get(key)
    return text(inner.get("name")) if isinstance(inner, Mapping) else None


def parse_ad(obj: Any, ad_account_id: str | None = None) -> Ad:
    """One ad of the catalog, from `/act_x/ads` or `/?ids=`."""
    if not isinstance(obj, Mapping):
        raise MalformedResponse("an ad is not an object")
    ad_id = _required_text(obj, "id", "an ad")
    creative = obj.get("creative")
    creative = creative if isinstance(creative, Mapping) else None
    account = text(obj.get("account_id"))
    if account and not account.startswith("act_"):
        account = f"act_{account}"
    return Ad(
        ad_id=ad_id,
        ad_account_id=ad_account_id or account,
        name=text(obj.get("name")),
        adset_id=text(obj.get("adset_id")),
        adset_name=_nested_name(obj, "adset"),
        campaign_id=text(obj.get("campaign_id")),
        campaign_name=_nested_name(obj, "campaign"),
        effective_status=text(obj.get("effective_status")),
        creative_type=creative_type(creative),
        creative_id=text(creative.get("id")) if creative else None,
        thumbnail_url=text(creative.get("thumbnail_url")) if creative else None,
    )


def parse_account(obj: Any, ad_account_id: str) -> AdAccount:
    """`GET /act_x`: name, currency, timezone and status."""
    if not isinstance(obj, Mapping):
        raise MalformedResponse(f"ad account {ad_account_id} is not an object")
    what = f"ad account {ad_account_id}"
    currency = _required_text(obj, "currency", what)
    timezone = _required_text(obj, "timezone_name", what)
    return AdAccount(
        ad_account_id=ad_account_id,
        name=text(obj.get("name")),
        currency=currency,
        timezone=timezone,
        account_status=int_or_none(obj.get("account_status")),
    )


def parse_listed_account(obj: Any) -> AdAccount:
    """One ad account of a listing (`/me/adaccounts`): `id` is `act_<digits>`, `account_id`
    the bare digits; either names it, and when both are given they agree."""
    if not isinstance(obj, Mapping):
        raise MalformedResponse("an ad account of the listing is not an object")
    named = [obj.get(key) for key in ("id", "account_id") if obj.get(key) is not None]
    if not named:
        raise MalformedResponse("an ad account of the listing has no 'id'")
    try:
        ids = {normalize_account_id(str(value)) for value in named}
    except ValueError:
        raise MalformedResponse("an ad account of the listing has an id that is not one") from None
    if len(ids) > 1:
        raise MalformedResponse("an ad account of the listing has an 'id' and 'account_id' apart")
    return parse_account(obj, ids.pop())
