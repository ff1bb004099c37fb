"""Trouble (demo layer): `rastro demo trouble`, staged in the running demo's fake Graph, and gone.

The running demo names its fake Graph in `data/fake-graph.json` (`demo.graph`); this asks
that server's control route, with the key the file holds, to stage or take away one kind of
trouble (`rastro_fake_graph.trouble`). Then it asks the pipeline for a sync of the accounts
concerned, as `rastro sync-now` does, so the trouble shows within a minute or two rather
than at the next wave. A dead token is mended at Meta only: its connection stays paused until
the operator reconnects it, as the notice says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.demo import DEMO_CONNECTION
from rastro_assets.demo.graph import CONTROL_HEADER, DemoGraph, read_graph_file
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Connection, Warehouse
from rastro_fake_graph.trouble import (
    ACCOUNT_KINDS,
    DEAD_TOKEN,
    KINDS,
    LOST_PERMISSION,
    SLOW,
    SLOW_ANSWER_SECONDS,
    THROTTLE,
    THROTTLE_REGAIN_MINUTES,
    USAGE,
)

MEND = "mend"
CONTROL_TIMEOUT_SECONDS = 10.0
GUIDE = 'docs/running.md, "Rehearse a bad day with the demo"'
SHOWS = (
    "within a minute or two it shows in the UI (Runs), `rastro status`, `rastro status --check`"
    " and the alert channels"
)
THROTTLE_SHOWS = (
    "within a minute or two it shows in the UI (Runs) and `rastro status`, and in `rastro status"
    " --check` and the alert channels once it has lasted RASTRO_ALERT_RATE_LIMITED_MINUTES (a"
    " minute in the demo unless set)"
)


class TroubleError(Exception):
    """Bad input, or no running demo to stage trouble in: one line, exit code 2."""


@dataclass(frozen=True)
class Staged:
    kind: str
    account: str | None

    def __str__(self) -> str:
        return f"{self.kind} {self.account}" if self.account else self.kind


def trouble(root: Path, words: Sequence[str], now: datetime) -> list[str]:
    """What `rastro demo trouble WORDS...` says: the staged trouble listed (no words), one
    kind staged (`KIND [ACCOUNT]`), or taken away (`mend [KIND [ACCOUNT]]`)."""
    words = list(words)
    mending = words[:1] == [MEND]
    if mending:
        words = words[1:]
    kind, account = _kind_and_account(words, mending)
    paths = DemoPaths(root)
    graph = running_graph(paths)
    if not words and not mending:
        staged = _ask(graph, None)
        if not staged:
            return ["nothing is staged in the running demo's fake Graph"]
        return [f"{_listed(staged)} (`rastro demo trouble {MEND}` takes it all away)"]
    with Warehouse(paths.duckdb).connect() as con:
        if mending:
            return [_mend(con, graph, kind, account, now)]
        assert kind is not None
        return [_stage(con, graph, kind, account, now)]


def running_graph(paths: DemoPaths) -> DemoGraph:
    """The fake Graph of the demo running in `paths`; TroubleError when none runs there."""
    graph = read_graph_file(paths.graph_file)
    if graph is None:
        raise TroubleError(
            f"no demo is running here: {paths.graph_file} names no running `rastro demo`"
            " (start one in this checkout first)"
        )
    return graph


def _kind_and_account(words: list[str], mending: bool) -> tuple[str | None, str | None]:
    if len(words) > 2:
        raise TroubleError(f"too many words: {' '.join(words[2:])!r}; one of {USAGE}")
    kind = words[0] if words else None
    account = words[1] if len(words) > 1 else None
    if kind is None:
        return None, None
    if kind not in KINDS:
        raise TroubleError(f"no trouble kind {kind!r}: one of {USAGE}, or {MEND} [KIND]")
    if account is not None:
        if kind not in ACCOUNT_KINDS:
            raise TroubleError(f"{kind} is about every account: it takes no ACCOUNT")
        try:
            account = normalize_account_id(account)
        except ValueError as exc:
            raise TroubleError(str(exc)) from None
    elif kind in ACCOUNT_KINDS and not mending:
        raise TroubleError(f"{kind} needs the ad account it is about: {kind} ACCOUNT")
    return kind, account


def _stage(
    con: Connection, graph: DemoGraph, kind: str, account: str | None, now: datetime
) -> str:
    linked = registry.linked_accounts(con)
    if account is not None and account not in {each.ad_account_id for each in linked}:
        raise TroubleError(
            f"{account} is not linked in the demo, so nothing would show: link it first"
            f" (`rastro link demo-shop {account} --connection {DEMO_CONNECTION}`)"
        )
    _ask(graph, {"stage": kind, "account": account})
    concerned = _concerned(linked, kind, account)
    _request_syncs(con, concerned, now)
    what = {
        DEAD_TOKEN: "the demo token is dead at Meta (190 / 463, session expired): the"
        f" connection {DEMO_CONNECTION!r} and its accounts pause at their next sync",
        THROTTLE: f"Meta refuses {account}'s insights reads, over its own limit (80000,"
        f" access back in {THROTTLE_REGAIN_MINUTES} min), every try until taken away",
        SLOW: f"Meta is overloaded: every answer comes {SLOW_ANSWER_SECONDS:g} s late and says"
        " \"Please retry your request later\", every try until taken away",
        LOST_PERMISSION: f"the demo token no longer reaches {account} (#200, permission)",
    }[kind]
    return (
        f"staged {Staged(kind, account)}: {what}; a sync of {_named(concerned)} is asked for:"
        f" {THROTTLE_SHOWS if kind == THROTTLE else SHOWS}; `rastro demo trouble {MEND} {kind}`"
        f" takes it away ({GUIDE})"
    )


def _mend(
    con: Connection, graph: DemoGraph, kind: str | None, account: str | None, now: datetime
) -> str:
    body: dict[str, str | None] = {"mend": kind or "all", "account": account}
    mended = [Staged(each["kind"], each["account"]) for each in _ask(graph, body, "changed")]
    if not mended:
        staged = _ask(graph, None)
        if not staged:
            return "nothing is staged in the running demo's fake Graph"
        return f"nothing of that is staged; {_listed(staged)}"
    linked = registry.linked_accounts(con)
    concerned = sorted(
        {
            act
            for each in mended
            if each.kind != DEAD_TOKEN
            for act in _concerned(linked, each.kind, each.account)
        }
    )
    _request_syncs(con, concerned, now)
    said = f"took away {', '.join(map(str, mended))}"
    if concerned:
        said += (
            f"; a sync of {_named(concerned)} is asked for: within a minute or two it reads"
            " again and the incident resolves"
        )
    if any(each.kind == DEAD_TOKEN for each in mended):
        said += (
            "; the demo token works at Meta again, and its connection stays paused until you"
            f" reconnect it as the notice says: `rastro connect {DEMO_CONNECTION}` with the"
            f" demo's token on stdin ({GUIDE})"
        )
    return said


def _concerned(linked: list[registry.LinkedAccount], kind: str, account: str | None) -> list[str]:
    """The linked accounts a kind of trouble touches: its account, the demo connection's
    accounts for a dead token, every account for a slow Meta."""
    if account is not None:
        return [account] if account in {each.ad_account_id for each in linked} else []
    if kind == DEAD_TOKEN:
        return [each.ad_account_id for each in linked if each.connection_id == DEMO_CONNECTION]
    if kind in ACCOUNT_KINDS:
        return []
    return [each.ad_account_id for each in linked]


def _request_syncs(con: Connection, accounts: list[str], now: datetime) -> None:
    for ad_account_id in accounts:
        registry.request_sync(con, ad_account_id, now)


def _ask(graph: DemoGraph, body: dict | None, answer: str = "staged") -> list[dict]:
    """The control route's answer under `answer` (GET without `body`, else POST)."""
    headers = {CONTROL_HEADER: graph.control_key}
    try:
        with httpx.Client(timeout=CONTROL_TIMEOUT_SECONDS) as client:
            if body is None:
                response = client.get(graph.control_url, headers=headers)
            else:
                response = client.post(graph.control_url, json=body, headers=headers)
            said = response.json()
    except (httpx.HTTPError, ValueError):
        raise TroubleError(
            f"the running demo's fake Graph at {graph.control_url} did not answer;"
            " is `rastro demo` still starting or stopping?"
        ) from None
    if response.status_code != 200 or not isinstance(said, dict):
        error = said.get("error") if isinstance(said, dict) else None
        raise TroubleError(f"the demo's fake Graph refused: {error or response.status_code}")
    return list(said.get(answer) or [])


def _listed(staged: list[dict]) -> str:
    if not staged:
        return "nothing is staged"
    return "staged: " + ", ".join(str(Staged(each["kind"], each["account"])) for each in staged)


def _named(accounts: Sequence[str]) -> str:
    if not accounts:
        return "no linked account"
    return ", ".join(accounts)
