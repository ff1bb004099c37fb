"""The fake Graph's request handling, shared by the httpx transport and the server.

`handle()` turns one request into a `FakeResponse`; the transport and the
loopback server only translate it into their own terms (a fault becomes an
httpx exception in-process, a stalled or cut socket over the network).

Answers follow the facts page's shapes. Choices where the page is silent:
- an account the token cannot read answers `(#200)` (HTTP 403, permission);
  an account that does not exist answers 100/33 "Unsupported get request";
- an unknown token answers 190 without subcode; no token at all answers 104
  (2500 on `/me`), as Meta does;
- reading an async report before `Job Completed` answers code 100;
- paging cursors are opaque and bound to their query; a page may hold fewer
  rows than `limit` (about one page in four), and `limit` above
  `MAX_PAGE_SIZE` is silently lowered;
- `/me/adaccounts` lists the accounts the token reads, by id; a business's
  `owned_ad_accounts` and `client_ad_accounts` list those of its accounts the
  token reads, and a token that reads none of a business's accounts (owned or
  client) is refused `(#200)`, as one with no role in the business;
- trouble staged to last (`rastro_fake_graph.trouble`): an overloaded world answers every
  Graph call "Please retry your request later" (code 2) before authentication; an account
  throttled by hand is refused 80000 / 2446079 on its insights calls after it, reporting its
  limit spent and Meta's regain minutes in the usage headers;
- the rate limits (`rastro_fake_graph.limits`) refuse a call after authentication, and
  every Graph answer, errors included, spends them and carries the headers of those its kind
  of call spends (insights, the account's management, or the app's platform calls).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from rastro_assets.timekeeping import local_date, zone
from rastro_fake_graph.images import jpeg
from rastro_fake_graph.limits import (
    INSIGHTS,
    MANAGEMENT,
    PLATFORM,
    load_units,
    regain_minutes,
)
from rastro_fake_graph.world import (
    ASYNC_POLLS_TO_FINISH,
    CDN_BASE,
    CDN_HOST,
    DEFAULT_PAGE_SIZE,
    EFFECTIVE_STATUSES,
    FAILURES,
    HIDDEN_UNLESS_FILTERED,
    MAX_IDS_PER_CALL,
    MAX_THUMBNAIL_SIZE_PX,
    MESSAGING_ACTION,
    RETENTION_MONTHS,
    THROTTLE_ACCOUNT_MESSAGE,
    THUMBNAIL_SIZE_PX,
    THUMBNAIL_TTL,
    TOKEN_MESSAGES,
    FailureSpec,
    FakeAccount,
    FakeAd,
    FakeWorld,
    Figures,
    ReportJob,
    months_before,
)

SERVER_CDN_PREFIX = "/fake-cdn"
JSON_TYPE = "application/json; charset=UTF-8"
INSIGHTS_FIELDS = frozenset(
    {"account_currency", "account_id", "account_name", "ad_id", "ad_name", "adset_id",
     "adset_name", "campaign_id", "campaign_name", "spend", "impressions", "clicks",
     "actions", "date_start", "date_stop"}
)
DEFAULT_INSIGHTS_FIELDS = ("impressions", "spend")
AD_FIELDS = frozenset(
    {"id", "name", "account_id", "adset_id", "adset", "campaign_id", "campaign",
     "effective_status", "status", "creative"}
)
DEFAULT_AD_FIELDS = ("id",)
ACCOUNT_FIELDS = frozenset(
    {"id", "account_id", "name", "currency", "timezone_name", "timezone_offset_hours_utc",
     "account_status"}
)
DEFAULT_ACCOUNT_FIELDS = ("id", "account_id")
REPORT_DEFAULT_FIELDS = ("id", "account_id", "async_status", "async_percent_completion",
                         "date_start", "date_stop")
UNSUPPORTED_GET = (
    "Unsupported get request. Object with ID '{id}' does not exist, cannot be loaded due to "
    "missing permissions, or does not support this operation. Please read the Graph API "
    "documentation at https://developers.facebook.com/docs/graph-api"
)
SHORT_PAGE_ONE_IN = 4
_VERSION_RE = re.compile(r"^/v\d+\.\d+(?=/|$)")
PLATFORM_ENDPOINTS = frozenset({"me", "adaccounts", "owned_ad_accounts", "client_ad_accounts"})


@dataclass(slots=True)
class FakeResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    # "timeout" | "dropped": the carrier breaks the exchange; "slow" | "huge": it sends the
    # body a byte at a time, or sends `huge_body` instead
    fault: str | None = None


class _Answer(Exception):
    """Raised inside handlers to answer at once (errors, mostly)."""

    def __init__(self, response: FakeResponse) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass(slots=True)
class _Request:
    world: FakeWorld
    method: str
    url: str
    scheme: str
    netloc: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    cdn_base: str
    endpoint: str = "unknown"
    account: str | None = None
    insights_headers: bool = False
    throttle_minutes: int | None = None
    # a staged throttle is the app's (code 4, not the account's load), and the name of a
    # rate limit that refused the call
    throttle_app: bool = False
    refused_by: str | None = None
    # the row-fields its answer holds: what it weighs in the insights load
    row_fields: int = 0
    fault: str | None = None

    @property
    def token(self) -> str | None:
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip() or None
        return self.params.get("access_token") or None


# -- entry point ---------------------------------------------------------------


def handle(
    world: FakeWorld,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes = b"",
    *,
    cdn_base: str = CDN_BASE,
) -> FakeResponse:
    """Answer one HTTP request to the fake Graph or the fake CDN."""
    split = urlsplit(url)
    lowered = {k.lower(): v for k, v in headers.items()}
    params = dict(parse_qsl(split.query, keep_blank_values=True))
    if method.upper() == "POST" and body and "json" not in lowered.get("content-type", ""):
        params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    request = _Request(
        world=world, method=method.upper(), url=url, scheme=split.scheme, netloc=split.netloc,
        path=split.path or "/", params=params, headers=lowered, cdn_base=cdn_base,
    )
    with world.lock:
        if split.hostname == CDN_HOST:
            return _cdn(request, request.path)
        if request.path.startswith(SERVER_CDN_PREFIX + "/"):
            return _cdn(request, request.path[len(SERVER_CDN_PREFIX):])
        try:
            return _graph(request)
        except _Answer as answer:
            return _with_usage(request, answer.response)


# -- Graph routing ----------------------------------------------------------------


def _graph(request: _Request) -> FakeResponse:
    world = request.world
    rest = _VERSION_RE.sub("", request.path, count=1)
    segments = [s for s in rest.split("/") if s]
    method = request.method
    _route(request, segments)
    world.record_call(request.endpoint, request.account, token=request.token)
    point = request.endpoint
    if point == "insights" and "after" in request.params:
        point = "insights_page"
    failure = world.take_failure(point, request.account)
    spec = FAILURES[failure.error] if failure else None
    if spec and spec.fault:
        # The real answer is computed (side effects included), then lost in transit.
        request.fault = spec.fault
    elif failure and spec and spec.job_outcome is None:
        if spec.throttled:
            request.throttle_minutes = failure.regain_minutes
            request.throttle_app = spec.code == 4 and spec.subcode != 1504039
        raise _Answer(_failure_response(request, spec))
    if world.overloaded:
        # An overloaded Meta asks to be asked again, whoever asks.
        raise _Answer(_failure_response(request, FAILURES["transient"]))
    _authenticate(request)
    _refuse_over_limit(request)

    if method not in ("GET", "POST"):
        raise _Answer(_error(request, 400, 100, f"(#100) Unsupported method {method}"))
    if request.endpoint == "me":
        body: Any = {"id": str(900000 + world.hash_int(request.token) % 100000),
                     "name": "Fake Rastro User"}
    elif request.endpoint == "ads_by_id":
        body = _ads_by_id(request)
    elif request.endpoint == "adaccounts":
        body = _account_listing(request, world.reachable(request.token or ""))
    elif request.endpoint in ("owned_ad_accounts", "client_ad_accounts"):
        body = _account_listing(request, _business_accounts(request, segments[0]))
    elif request.endpoint == "account":
        body = _account_node(request, _readable_account(request))
    elif request.endpoint == "ads":
        body = _ads(request, _readable_account(request))
    elif request.endpoint == "insights":
        body = _insights(request, _readable_account(request))
    elif request.endpoint == "async":
        body = _start_job(request, _readable_account(request),
                          (spec.job_outcome if spec else None) or "complete")
    elif request.endpoint == "report":
        body = _report_status(request, _readable_job(request, segments[0]))
    elif request.endpoint == "report_insights":
        body = _report_rows(request, _readable_job(request, segments[0]))
    elif request.endpoint == "ad":
        body = _single_ad(request, segments[0])
    else:
        raise _Answer(_error(request, 400, 100, UNSUPPORTED_GET.format(id="/".join(segments)),
                             subcode=33))
    return _with_usage(request, _json(200, body))


def _route(request: _Request, segments: list[str]) -> None:
    world = request.world
    method = request.method
    if not segments:
        request.endpoint = "ads_by_id" if "ids" in request.params else "unknown"
        ids = [i for i in request.params.get("ids", "").split(",") if i]
        if ids:
            try:
                request.account = world.ad(ids[0]).ad_account_id
            except KeyError:
                request.account = None
        return
    head = segments[0]
    if head.startswith("act_"):
        request.account = head
        if len(segments) == 1:
            request.endpoint = "account"
        elif segments[1:] == ["insights"]:
            request.endpoint = "async" if method == "POST" else "insights"
            request.insights_headers = True
        elif segments[1:] == ["ads"]:
            request.endpoint = "ads"
        return
    if head == "me" and len(segments) == 1:
        request.endpoint = "me"
        return
    if head == "me" and segments[1:] == ["adaccounts"]:
        request.endpoint = "adaccounts"
        return
    if head.isdigit() and segments[1:] in (["owned_ad_accounts"], ["client_ad_accounts"]):
        request.endpoint = segments[1]
        return
    job = world.job(head)
    if job is not None:
        request.account = job.ad_account_id
        request.insights_headers = True
        if len(segments) == 1:
            request.endpoint = "report"
        elif segments[1:] == ["insights"]:
            request.endpoint = "report_insights"
        return
    if len(segments) == 1 and head.isdigit():
        request.endpoint = "ad"
        try:
            request.account = world.ad(head).ad_account_id
        except KeyError:
            request.account = None


def _authenticate(request: _Request) -> None:
    state, subcode = request.world.token_state(request.token)
    if state == "missing":
        if request.endpoint == "me":
            raise _Answer(_error(request, 400, 2500, "An active access token must be used to "
                                 "query information about the current user."))
        raise _Answer(_error(request, 400, 104,
                             "An access token is required to request this resource."))
    if state in ("unknown", "dead"):
        raise _Answer(_error(request, 400, 190, TOKEN_MESSAGES[subcode], subcode=subcode))


def _readable_account(request: _Request) -> FakeAccount:
    world = request.world
    act = request.account or ""
    account = world.accounts.get(act)
    if account is None:
        raise _Answer(_error(request, 400, 100, UNSUPPORTED_GET.format(id=act), subcode=33))
    if not world.can_read(request.token or "", act):
        raise _Answer(_error(
            request, 403, 200,
            "(#200) Ad account owner has NOT grant ads_management or ads_read permission",
            error_type="OAuthException",
        ))
    return account


def _readable_job(request: _Request, run_id: str) -> ReportJob:
    job = request.world.job(run_id)
    if job is None or not request.world.can_read(request.token or "", job.ad_account_id):
        raise _Answer(_error(request, 400, 100, UNSUPPORTED_GET.format(id=run_id), subcode=33))
    return job


# -- responses --------------------------------------------------------------------


def _json(status: int, body: Any) -> FakeResponse:
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return FakeResponse(status, [("Content-Type", JSON_TYPE)], data)


def _error(
    request: _Request,
    status: int,
    code: int,
    message: str,
    *,
    subcode: int | None = None,
    error_type: str = "OAuthException",
    is_transient: bool | None = None,
    user_title: str | None = None,
    user_msg: str | None = None,
) -> FakeResponse:
    error: dict[str, Any] = {"message": message, "type": error_type, "code": code}
    if subcode is not None:
        error["error_subcode"] = subcode
    if is_transient is not None:
        error["is_transient"] = is_transient
    if user_title:
        error["error_user_title"] = user_title
    if user_msg:
        error["error_user_msg"] = user_msg
    error["fbtrace_id"] = request.world.next_trace_id()
    response = _json(status, {"error": error})
    response.headers.append(("WWW-Authenticate", f'OAuth "Facebook Platform" "{error_type}"'))
    return response


def _failure_response(request: _Request, spec: FailureSpec) -> FakeResponse:
    if spec.body is not None:
        return FakeResponse(spec.status, [("Content-Type", spec.content_type)], spec.body)
    assert spec.code is not None
    return _error(
        request, spec.status, spec.code, spec.message, subcode=spec.subcode,
        error_type=spec.error_type, is_transient=spec.is_transient,
        user_title=spec.user_title, user_msg=spec.user_msg,
    )


def _kind(request: _Request) -> str | None:
    """Which of Meta's limits a Graph call spends: insights, management or platform."""
    if request.insights_headers:
        return INSIGHTS
    if request.account is not None or request.endpoint in ("ads_by_id", "ad"):
        return MANAGEMENT
    if request.endpoint in PLATFORM_ENDPOINTS or request.endpoint == "unknown":
        return PLATFORM
    return None


def _known_account(request: _Request) -> str | None:
    return request.account if request.account in request.world.accounts else None


def _bucket_calls(request: _Request) -> dict[str, int]:
    """The calls the request counts in each account's business-use-case bucket: one, or one
    for each id of `?ids=`, to that id's own account."""
    world = request.world
    if request.endpoint != "ads_by_id":
        account = _known_account(request)
        return {account: 1} if account else {}
    calls: dict[str, int] = {}
    for ad_id in (i.strip() for i in request.params.get("ids", "").split(",")):
        try:
            act = world.ad(ad_id).ad_account_id
        except KeyError:
            continue
        calls[act] = calls.get(act, 0) + 1
    return calls


def _refuse_over_limit(request: _Request) -> None:
    world = request.world
    kind = _kind(request)
    if kind is None:
        return
    regain = world.throttled_for(_known_account(request)) if kind == INSIGHTS else None
    if regain is not None:
        request.throttle_minutes = regain
        raise _Answer(_error(request, 400, 80000, THROTTLE_ACCOUNT_MESSAGE, subcode=2446079))
    refusal = world.ledger.refusal(
        world.limits, kind, world.monotonic(), account=_known_account(request),
        write=request.method == "POST",
        buckets=[(act, world.active_ads(act)) for act in _bucket_calls(request)],
    )
    if refusal is not None:
        request.refused_by = refusal.limit
        raise _Answer(_error(request, 400, refusal.code, refusal.message,
                             subcode=refusal.subcode, user_title=refusal.user_title,
                             user_msg=refusal.user_msg))


def _with_usage(request: _Request, response: FakeResponse) -> FakeResponse:
    """Spend the call against Meta's limits, then add the headers reporting them: every
    Graph answer, errors included, carries those of the limits its kind of call spends."""
    world = request.world
    kind = _kind(request)
    if kind is None:
        response.fault = response.fault or request.fault
        return response
    now = world.monotonic()
    account = _known_account(request)
    staged = request.throttle_minutes is not None
    world.ledger.spend(
        kind, now, account=account, buckets=_bucket_calls(request).items(),
        weight=load_units(request.row_fields),
        user_error=response.status >= 400 and request.refused_by is None and not staged,
    )
    if kind == PLATFORM:
        response.headers.append(_platform_header(request, now))
    elif account is not None:
        response.headers.extend(_account_headers(request, kind, account, now))
    response.fault = response.fault or request.fault
    return response


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _platform_header(request: _Request, now: float) -> tuple[str, str]:
    world = request.world
    pct = world.ledger.platform_pct(world.limits, now)
    if request.throttle_minutes is not None:
        pct = max(pct, 100.0)
    return ("X-App-Usage", _dumps({
        "call_count": int(pct), "total_time": int(pct * 0.6), "total_cputime": int(pct * 0.4)}))


def _account_headers(request: _Request, kind: str, account: str,
                     now: float) -> list[tuple[str, str]]:
    world = request.world
    model, ledger = world.limits, world.ledger
    tier = model.access_tier
    bucket = ledger.bucket(model, account, kind, world.active_ads(account), now)
    call_pct, time_pct = bucket.call_count, bucket.total_time
    regain = regain_minutes(bucket.regain_seconds) if bucket.over else 0
    score_pct = ledger.score_pct(model, account, now)
    reset_seconds = math.ceil(ledger.score_reset_seconds(account, now))
    app_load = ledger.app_load_pct(model, now)
    account_load = ledger.account_load_pct(model, account, now)
    if request.throttle_minutes is not None:
        # A staged throttle reports its account at its limit, and the app's load only
        # when its code is the app's.
        call_pct, time_pct, score_pct, account_load = (
            max(value, 100.0) for value in (call_pct, time_pct, score_pct, account_load))
        if request.throttle_app:
            app_load = max(app_load, 100.0)
        regain = request.throttle_minutes
        # Throttled, the window's reset is when access returns.
        reset_seconds = regain * 60
    headers = [
        ("X-Ad-Account-Usage", _dumps({
            "acc_id_util_pct": round(score_pct, 2), "reset_time_duration": reset_seconds,
            "ads_api_access_tier": tier})),
        ("X-Business-Use-Case-Usage", _dumps({
            world.business_id(account): [{
                "type": "ads_insights" if kind == INSIGHTS else "ads_management",
                "call_count": int(call_pct), "total_cputime": int(time_pct * 0.6),
                "total_time": int(time_pct),
                "estimated_time_to_regain_access": regain,
                "ads_api_access_tier": tier}]})),
    ]
    if kind == INSIGHTS:
        headers.append(("X-FB-Ads-Insights-Throttle", _dumps({
            "app_id_util_pct": round(app_load, 2), "acc_id_util_pct": round(account_load, 2),
            "ads_api_access_tier": tier})))
    return headers


# -- paging -----------------------------------------------------------------------


def _query_digest(request: _Request) -> str:
    stable = sorted((k, v) for k, v in request.params.items()
                    if k not in ("after", "before", "limit", "access_token"))
    return hashlib.blake2b(f"{request.path}|{stable}".encode(), digest_size=6).hexdigest()


def _cursor(offset: int, digest: str) -> str:
    return base64.urlsafe_b64encode(f"fake:{offset}:{digest}".encode()).decode().rstrip("=")


def _offset(request: _Request, cursor: str, digest: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        tag, offset, bound = base64.urlsafe_b64decode(padded).decode().split(":")
        if tag == "fake" and bound == digest and int(offset) >= 0:
            return int(offset)
    except (ValueError, UnicodeDecodeError):
        pass
    raise _Answer(_error(request, 400, 100, "(#100) Invalid cursor"))


def _limit(request: _Request) -> int:
    raw = request.params.get("limit", str(DEFAULT_PAGE_SIZE))
    try:
        limit = int(raw)
    except ValueError:
        raise _Answer(_error(request, 400, 100, "(#100) param limit must be an integer")) from None
    if limit < 1:
        raise _Answer(_error(request, 400, 100, "(#100) param limit must be positive"))
    return min(limit, request.world.max_page_size)


def _page(request: _Request, items: list[Any]) -> dict[str, Any]:
    """`{"data": [...], "paging": {...}}` for the page the request names."""
    digest = _query_digest(request)
    limit = _limit(request)
    after = request.params.get("after")
    offset = _offset(request, after, digest) if after else 0
    size = limit
    short_hash = request.world.hash_int("short", digest, offset)
    if limit > 1 and short_hash % SHORT_PAGE_ONE_IN == 0:
        size = max(1, limit - 1 - (short_hash >> 8) % max(1, limit // 2))
    data = items[offset:offset + size]
    request.row_fields += sum(len(item) for item in data if isinstance(item, Mapping))
    endless = request.fault == "endless"
    if not data and not endless:
        return {"data": []}
    end = offset + max(len(data), 1)
    paging: dict[str, Any] = {
        "cursors": {"before": _cursor(offset, digest), "after": _cursor(end, digest)}
    }
    if end < len(items) or endless:
        paging["next"] = _link(request, after=_cursor(end, digest))
    if offset > 0:
        paging["previous"] = _link(request, before=_cursor(offset, digest))
    return {"data": data, "paging": paging}


def _link(request: _Request, **cursor: str) -> str:
    params = {k: v for k, v in request.params.items() if k not in ("after", "before")}
    params.update(cursor)
    return urlunsplit((request.scheme, request.netloc, request.path, urlencode(params), ""))


# -- fields -------------------------------------------------------------------------


@dataclass(slots=True)
class _Field:
    name: str
    modifiers: dict[str, str]
    children: dict[str, _Field] | None


def parse_fields(spec: str) -> dict[str, _Field]:
    """Graph field syntax: `a,b{c,d},e.m(1).n(2){f}`."""
    fields: dict[str, _Field] = {}
    depth = 0
    current = ""
    parts: list[str] = []
    for char in spec:
        if char in "{(":
            depth += 1
        elif char in "})":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    for part in (p.strip() for p in parts):
        if not part:
            continue
        head, brace, tail = part.partition("{")
        children = parse_fields(tail.rstrip()[:-1]) if brace else None
        name, *mods = re.findall(r"[^.]+\([^)]*\)|[^.]+", head)
        modifiers = {}
        for mod in mods:
            match = re.fullmatch(r"(\w+)\((.*)\)", mod)
            if match:
                modifiers[match.group(1)] = match.group(2)
        fields[name.strip()] = _Field(name.strip(), modifiers, children)
    return fields


def _requested(request: _Request, known: frozenset[str], default: tuple[str, ...],
               what: str) -> dict[str, _Field]:
    raw = request.params.get("fields")
    if not raw:
        return {name: _Field(name, {}, None) for name in default}
    fields = parse_fields(raw)
    for name in fields:
        if name not in known:
            raise _Answer(_error(
                request, 400, 100,
                f"(#100) Tried accessing nonexisting field ({name}) on node type ({what})"))
    return fields


def _pick(full: Mapping[str, Any], fields: Mapping[str, _Field], always: tuple[str, ...] = ()):
    out = {k: full[k] for k in always if k in full}
    for name, spec in fields.items():
        if name not in full:
            continue
        value = full[name]
        if spec.children is not None and isinstance(value, Mapping):
            value = _pick(value, spec.children, always=("id",))
        out[name] = value
    return out


# -- insights -------------------------------------------------------------------------


def _json_param(request: _Request, name: str) -> Any:
    raw = request.params.get(name)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise _Answer(_error(request, 400, 100, f"(#100) param {name} must be JSON")) from None


def _statuses_filter(request: _Request) -> frozenset[str]:
    filtering = _json_param(request, "filtering")
    statuses = set(EFFECTIVE_STATUSES) - HIDDEN_UNLESS_FILTERED
    if filtering is None:
        return frozenset(statuses)
    if not isinstance(filtering, list):
        raise _Answer(_error(request, 400, 100, "(#100) param filtering must be an array"))
    for index, rule in enumerate(filtering):
        if not isinstance(rule, dict) or not {"field", "operator", "value"} <= rule.keys():
            raise _Answer(_error(request, 400, 100,
                                 f"(#100) param filtering[{index}] needs field, operator, value"))
        field_name = rule["field"]
        if field_name not in ("ad.effective_status", "effective_status"):
            raise _Answer(_error(request, 400, 100,
                                 f"(#100) Filtering field {field_name} is invalid"))
        values = rule["value"] if isinstance(rule["value"], list) else [rule["value"]]
        for value in values:
            if value not in EFFECTIVE_STATUSES:
                raise _Answer(_error(
                    request, 400, 100,
                    f"(#100) param filtering[{index}][value] must be one of "
                    f"{{{', '.join(EFFECTIVE_STATUSES)}}}"))
        if rule["operator"] == "IN":
            statuses = set(values)
        elif rule["operator"] == "NOT_IN":
            statuses = set(EFFECTIVE_STATUSES) - set(values)
        else:
            raise _Answer(_error(request, 400, 100,
                                 f"(#100) Filtering operator {rule['operator']} is invalid"))
    return frozenset(statuses)


def _insights_query(request: _Request, account: FakeAccount):
    if request.params.get("level", "ad") != "ad":
        raise _Answer(_error(request, 400, 100, "(#100) this fake Graph supports level=ad only"))
    if request.params.get("time_increment", "1") != "1":
        raise _Answer(_error(request, 400, 100,
                             "(#100) this fake Graph supports time_increment=1 only"))
    today = local_date(request.world.now(), account.timezone)
    time_range = _json_param(request, "time_range")
    if time_range is None:
        since, until = today - timedelta(days=30), today - timedelta(days=1)
    else:
        try:
            since = date.fromisoformat(time_range["since"])
            until = date.fromisoformat(time_range["until"])
        except (TypeError, KeyError, ValueError):
            raise _Answer(_error(request, 400, 100,
                                 "(#100) param time_range must be {'since':..,'until':..}")
                          ) from None
        if since > until:
            raise _Answer(_error(request, 400, 100,
                                 "(#100) time_range since must not be after until"))
    if since < months_before(today, RETENTION_MONTHS):
        raise _Answer(_error(request, 400, 3018,
                             "(#3018) The start date of the time range cannot be beyond "
                             "37 months from the current date"))
    fields = _requested(request, INSIGHTS_FIELDS, DEFAULT_INSIGHTS_FIELDS, "AdsInsights")
    return since, until, tuple(fields), _statuses_filter(request)


def _insight_json(account: FakeAccount, ad: FakeAd, day: date, figures: Figures,
                  fields: tuple[str, ...]) -> dict[str, Any]:
    actions = []
    if figures.clicks:
        actions.append({"action_type": "link_click", "value": str(figures.clicks)})
        actions.append({"action_type": "post_engagement",
                        "value": str(figures.clicks + figures.impressions // 40)})
    if figures.conversations:
        actions.append({"action_type": MESSAGING_ACTION, "value": str(figures.conversations)})
        actions.append({"action_type": "onsite_conversion.total_messaging_connection",
                        "value": str(figures.conversations + 1)})
    full: dict[str, Any] = {
        "account_currency": account.currency,
        "account_id": account.ad_account_id.removeprefix("act_"),
        "account_name": account.name,
        "ad_id": ad.ad_id,
        "ad_name": ad.name,
        "adset_id": ad.adset_id,
        "adset_name": ad.adset_name,
        "campaign_id": ad.campaign_id,
        "campaign_name": ad.campaign_name,
        "spend": str(figures.spend),
        "impressions": str(figures.impressions),
        "clicks": str(figures.clicks),
    }
    if actions:
        full["actions"] = actions
    row = {name: full[name] for name in fields if name in full}
    row["date_start"] = row["date_stop"] = day.isoformat()
    return row


def _insights(request: _Request, account: FakeAccount) -> dict[str, Any]:
    world = request.world
    since, until, fields, statuses = _insights_query(request, account)
    rows = world.rows(account, since, until, statuses)
    if len(rows) > world.row_cap:
        spec = FAILURES["too_much_data"]
        raise _Answer(_error(request, spec.status, spec.code or 1, spec.message))
    items = [_insight_json(account, ad, day, figures, fields) for ad, day, figures in rows]
    return _page(request, items)


def _start_job(request: _Request, account: FakeAccount, outcome: str) -> dict[str, Any]:
    since, until, fields, statuses = _insights_query(request, account)
    job = request.world.new_job(
        ad_account_id=account.ad_account_id, token=request.token or "", since=since,
        until=until, fields=fields, statuses=statuses, outcome=outcome,
    )
    return {"report_run_id": job.run_id}


def _job_state(job: ReportJob, now: float) -> tuple[str, int]:
    if job.polls <= 1:
        return "Job Not Started", 0
    if job.outcome == "skipped":
        return "Job Skipped", 0
    if job.outcome == "stuck" or job.polls < ASYNC_POLLS_TO_FINISH:
        return "Job Running", min(99, 100 * (job.polls - 1) // ASYNC_POLLS_TO_FINISH)
    elapsed = now - job.started
    if elapsed < job.duration_seconds:
        return "Job Running", min(99, int(100 * elapsed / job.duration_seconds))
    if job.outcome == "failed":
        return "Job Failed", 0
    return "Job Completed", 100



def _report_status(request: _Request, job: ReportJob) -> dict[str, Any]:
    world = request.world
    job.polls += 1
    status, percent = _job_state(job, world.monotonic())
    if status == "Job Completed" and job.rows is None:
        job.rows = world.rows(world.accounts[job.ad_account_id], job.since, job.until,
                              job.statuses)
    full: dict[str, Any] = {
        "id": job.run_id,
        "account_id": job.ad_account_id.removeprefix("act_"),
        "async_status": status,
        "async_percent_completion": percent,
        "date_start": job.since.isoformat(),
        "date_stop": job.until.isoformat(),
    }
    if status == "Job Failed":
        full["error_code"] = 1
        full["error_message"] = "An unknown error occurred while running the report"
    names = parse_fields(request.params["fields"]) if request.params.get("fields") else {
        name: _Field(name, {}, None) for name in REPORT_DEFAULT_FIELDS}
    out = _pick(full, names, always=("id",))
    if status == "Job Failed":
        out.update(error_code=full["error_code"], error_message=full["error_message"])
    return out


def _report_rows(request: _Request, job: ReportJob) -> dict[str, Any]:
    if job.rows is None:
        status, _ = _job_state(job, request.world.monotonic())
        raise _Answer(_error(request, 400, 100,
                             f"(#100) The report is not ready: its status is {status}"))
    account = request.world.accounts[job.ad_account_id]
    items = [_insight_json(account, ad, day, figures, job.fields) for ad, day, figures in job.rows]
    return _page(request, items)


# -- catalog -----------------------------------------------------------------------


def _cdn_url(request: _Request, kind: str, ad: FakeAd, width: int, height: int) -> str:
    world = request.world
    extension = "png" if kind == "thumb" else "jpg"
    path = f"/{kind}/{ad.ad_id}/{ad.creative_id}.{extension}"
    hour = 3600
    exp = (int(world.now().timestamp()) // hour + 1) * hour + int(THUMBNAIL_TTL.total_seconds())
    query: dict[str, Any] = {}
    if kind == "thumb" and (width, height) != (THUMBNAIL_SIZE_PX, THUMBNAIL_SIZE_PX):
        query.update(w=width, h=height)
    query.update(sig=world.sign(f"{path}|{width}x{height}", exp), exp=exp)
    return f"{request.cdn_base}{path}?{urlencode(query)}"


def _creative_json(request: _Request, ad: FakeAd, modifiers: Mapping[str, str]) -> dict[str, Any]:
    def size(name: str) -> int:
        try:
            value = int(modifiers.get(name, THUMBNAIL_SIZE_PX))
        except ValueError:
            value = THUMBNAIL_SIZE_PX
        return max(1, min(MAX_THUMBNAIL_SIZE_PX, value))

    width, height = size("thumbnail_width"), size("thumbnail_height")
    page_id = "1040000" + ad.ad_account_id.removeprefix("act_")
    link = f"https://shop.rastro.test/p/{ad.ad_id}"
    creative: dict[str, Any] = {"id": ad.creative_id}
    if request.world.has_thumbnail(ad):
        creative["thumbnail_url"] = _cdn_url(request, "thumb", ad, width, height)
    image_url = _cdn_url(request, "img", ad, width, height)
    kind = ad.creative_kind
    if kind == "video":
        video_id = "2050" + ad.creative_id
        creative.update(object_type="VIDEO", video_id=video_id, object_story_spec={
            "page_id": page_id,
            "video_data": {"video_id": video_id, "image_url": image_url, "message": ad.name,
                           "call_to_action": {"type": "SHOP_NOW", "value": {"link": link}}},
        })
    elif kind == "image":
        creative.update(object_type="SHARE", image_url=image_url, object_story_spec={
            "page_id": page_id,
            "link_data": {"link": link, "message": ad.name, "image_hash": ad.creative_id[-8:]},
        })
    elif kind == "photo":
        creative.update(object_type="PHOTO", object_story_spec={
            "page_id": page_id, "photo_data": {"image_hash": ad.creative_id[-8:]},
        })
    elif kind == "carousel":
        creative.update(object_type="SHARE", object_story_spec={
            "page_id": page_id,
            "link_data": {"link": link, "message": ad.name, "child_attachments": [
                {"link": f"{link}?card={n}", "name": f"{ad.name} {n}",
                 "image_hash": f"{ad.creative_id[-6:]}{n:02d}"} for n in range(1, 4)
            ]},
        })
    else:
        creative.update(object_type="STATUS", asset_feed_spec={
            "bodies": [{"text": ad.name}], "titles": [{"text": ad.campaign_name}],
        })
    return creative


def _ad_json(request: _Request, ad: FakeAd, fields: Mapping[str, _Field]) -> dict[str, Any]:
    creative_field = fields.get("creative")
    full: dict[str, Any] = {
        "id": ad.ad_id,
        "name": ad.name,
        "account_id": ad.ad_account_id.removeprefix("act_"),
        "adset_id": ad.adset_id,
        "adset": {"id": ad.adset_id, "name": ad.adset_name},
        "campaign_id": ad.campaign_id,
        "campaign": {"id": ad.campaign_id, "name": ad.campaign_name},
        "effective_status": ad.effective_status,
        "status": "ACTIVE" if ad.effective_status == "ACTIVE" else ad.effective_status,
    }
    if creative_field is not None:
        full["creative"] = _creative_json(request, ad, creative_field.modifiers)
    return _pick(full, fields, always=("id",))


def _ads(request: _Request, account: FakeAccount) -> dict[str, Any]:
    statuses = set(EFFECTIVE_STATUSES) - HIDDEN_UNLESS_FILTERED
    raw = _json_param(request, "effective_status")
    if raw is not None:
        values = raw if isinstance(raw, list) else [raw]
        for index, value in enumerate(values):
            if value not in EFFECTIVE_STATUSES:
                raise _Answer(_error(
                    request, 400, 100,
                    f"(#100) param effective_status[{index}] must be one of "
                    f"{{{', '.join(EFFECTIVE_STATUSES)}}}"))
        statuses = set(values)
    fields = _requested(request, AD_FIELDS, DEFAULT_AD_FIELDS, "Ad")
    ads = [ad for _, ad in sorted(account.ads.items()) if ad.effective_status in statuses]
    return _page(request, [_ad_json(request, ad, fields) for ad in ads])


def _ads_by_id(request: _Request) -> dict[str, Any]:
    world = request.world
    ids = [i.strip() for i in request.params.get("ids", "").split(",") if i.strip()]
    if len(ids) > MAX_IDS_PER_CALL:
        raise _Answer(_error(request, 400, 100,
                             f"(#100) Too many IDs. Maximum: {MAX_IDS_PER_CALL}"))
    fields = _requested(request, AD_FIELDS, DEFAULT_AD_FIELDS, "Ad")
    found: dict[str, FakeAd] = {}
    unknown = []
    for ad_id in ids:
        try:
            found[ad_id] = world.ad(ad_id)
        except KeyError:
            unknown.append(ad_id)
    if unknown:
        raise _Answer(_error(request, 404, 803,
                             "(#803) Some of the aliases you requested do not exist: "
                             + ",".join(unknown)))
    for ad in found.values():
        if not world.can_read(request.token or "", ad.ad_account_id):
            raise _Answer(_error(request, 403, 200,
                                 "(#200) Ad account owner has NOT grant ads_management or "
                                 "ads_read permission"))
    return {ad_id: _ad_json(request, ad, fields) for ad_id, ad in found.items()}


def _single_ad(request: _Request, ad_id: str) -> dict[str, Any]:
    world = request.world
    try:
        ad = world.ad(ad_id)
    except KeyError:
        raise _Answer(_error(request, 400, 100, UNSUPPORTED_GET.format(id=ad_id),
                             subcode=33)) from None
    if not world.can_read(request.token or "", ad.ad_account_id):
        raise _Answer(_error(request, 400, 100, UNSUPPORTED_GET.format(id=ad_id), subcode=33))
    return _ad_json(request, ad, _requested(request, AD_FIELDS, DEFAULT_AD_FIELDS, "Ad"))


def _account_node(request: _Request, account: FakeAccount) -> dict[str, Any]:
    fields = _requested(request, ACCOUNT_FIELDS, DEFAULT_ACCOUNT_FIELDS, "AdAccount")
    return _account_json(request, account, fields)


def _account_listing(request: _Request, accounts: list[FakeAccount]) -> dict[str, Any]:
    fields = _requested(request, ACCOUNT_FIELDS, DEFAULT_ACCOUNT_FIELDS, "AdAccount")
    return _page(request, [_account_json(request, account, fields) for account in accounts])


def _business_accounts(request: _Request, business_id: str) -> list[FakeAccount]:
    world = request.world
    if not world.is_business(business_id):
        raise _Answer(_error(request, 400, 100, UNSUPPORTED_GET.format(id=business_id),
                             subcode=33))
    edge = world.owned_accounts if request.endpoint == "owned_ad_accounts" else (
        world.client_accounts)
    token = request.token or ""
    ours = [*world.owned_accounts(business_id), *world.client_accounts(business_id)]
    if not any(world.can_read(token, account.ad_account_id) for account in ours):
        raise _Answer(_error(
            request, 403, 200, "(#200) Requires business_management permission to manage the"
            " object", error_type="OAuthException"))
    return [account for account in edge(business_id)
            if world.can_read(token, account.ad_account_id)]


def _account_json(
    request: _Request, account: FakeAccount, fields: Mapping[str, _Field]
) -> dict[str, Any]:
    offset = request.world.now().astimezone(zone(account.timezone)).utcoffset()
    hours = offset.total_seconds() / 3600 if offset is not None else 0.0
    full = {
        "id": account.ad_account_id,
        "account_id": account.ad_account_id.removeprefix("act_"),
        "name": account.name,
        "currency": account.currency,
        "timezone_name": account.timezone,
        "timezone_offset_hours_utc": int(hours) if hours.is_integer() else hours,
        "account_status": account.account_status,
    }
    return _pick(full, fields, always=("id",))


# -- CDN -----------------------------------------------------------------------------


def _text(status: int, text: str) -> FakeResponse:
    return FakeResponse(status, [("Content-Type", "text/plain; charset=utf-8")], text.encode())


def _cdn(request: _Request, path: str) -> FakeResponse:
    world = request.world
    world.record_call("thumbnail", None, token=request.token, graph=False)
    failure = world.take_failure("thumbnail", None)
    spec = FAILURES[failure.error] if failure else None
    if spec and not spec.fault:
        return _failure_response(request, spec)
    response = _cdn_answer(request, path)
    response.fault = spec.fault if spec else None
    return response


def _cdn_answer(request: _Request, path: str) -> FakeResponse:
    world = request.world
    match = re.fullmatch(r"/(thumb|img)/(\d+)/(\d+)\.(png|jpg)", path)
    if request.method != "GET" or not match:
        return _text(404, "Not Found")
    kind, ad_id, creative_id, _ = match.groups()
    try:
        width = int(request.params.get("w", THUMBNAIL_SIZE_PX))
        height = int(request.params.get("h", THUMBNAIL_SIZE_PX))
        exp = int(request.params.get("exp", ""))
    except ValueError:
        return _text(403, "Bad URL hash")
    if request.params.get("sig") != world.sign(f"{path}|{width}x{height}", exp):
        return _text(403, "Bad URL hash")
    if exp < world.now().timestamp():
        return _text(403, "URL signature expired")
    try:
        ad = world.ad(ad_id)
    except KeyError:
        return _text(404, "Not Found")
    if not creative_id.startswith(ad.ad_id) or int(creative_id[len(ad.ad_id):] or 0) < 1:
        return _text(404, "Not Found")
    if kind == "thumb":
        return FakeResponse(200, [("Content-Type", "image/png")],
                            world.creative_png(ad_id, creative_id, width, height))
    return FakeResponse(200, [("Content-Type", "image/jpeg")],
                        jpeg(world.creative_colours(ad_id, creative_id)))


# -- in-process transport ---------------------------------------------------------------


HUGE_BODY_CHUNK_BYTES = 1 << 16


def huge_body(total: int) -> Iterator[bytes]:
    """`total` bytes of valid JSON, `{"data": [` and blanks, in chunks, made as they go."""
    head, tail = b'{"data": [', b"]}"
    yield head
    blanks = max(0, total - len(head) - len(tail))
    chunk = b" " * HUGE_BODY_CHUNK_BYTES
    while blanks > 0:
        yield chunk[:blanks]
        blanks -= HUGE_BODY_CHUNK_BYTES
    yield tail


class _Bytes(httpx.SyncByteStream):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks


def dribble(body: bytes, world: FakeWorld) -> Iterator[bytes]:
    """`body` a byte at a time, `world.slow_body_byte_seconds` apart."""
    for index in range(len(body)):
        world.sleep(world.slow_body_byte_seconds)
        yield body[index:index + 1]


class _CutStream(httpx.SyncByteStream):
    """A body that stops halfway, as when the connection drops mid-transfer."""

    def __init__(self, partial: bytes, expected: int) -> None:
        self._partial = partial
        self._expected = expected

    def __iter__(self):
        yield self._partial
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body "
            f"(received {len(self._partial)} bytes, expected {self._expected})"
        )


class FakeGraphTransport(httpx.BaseTransport):
    """The fake Graph and CDN in-process, for `httpx.Client(transport=...)`."""

    def __init__(self, world: FakeWorld, *, cdn_base: str = CDN_BASE) -> None:
        self.world = world
        self.cdn_base = cdn_base

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        answer = handle(self.world, request.method, str(request.url), dict(request.headers),
                        body, cdn_base=self.cdn_base)
        if answer.fault == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        headers = [*answer.headers, ("Content-Length", str(len(answer.body)))]
        if answer.fault == "dropped":
            partial = answer.body[: len(answer.body) // 2]
            return httpx.Response(answer.status, headers=headers,
                                  stream=_CutStream(partial, len(answer.body)), request=request)
        if answer.fault == "huge":
            return httpx.Response(answer.status, headers=answer.headers, request=request,
                                  stream=_Bytes(huge_body(self.world.huge_body_bytes)))
        if answer.fault == "slow":
            return httpx.Response(answer.status, headers=headers, request=request,
                                  stream=_Bytes(dribble(answer.body, self.world)))
        return httpx.Response(answer.status, headers=headers, content=answer.body,
                              request=request)
