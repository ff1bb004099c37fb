"""`rastro demo trouble` in a demo's checkout against a served fake Graph named in its
`data/fake-graph.json`, and `rastro demo` serving that Graph while Dagster runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from rastro_assets import demo
from rastro_assets.demo import graph_server
from rastro_assets.demo.graph import DemoGraph, read_graph_file, write_graph_file
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import Rastro
from rastro_fake_graph import DEMO_TOKEN, FakeWorld, serve

REPO = Path(__file__).resolve().parents[2]
KEY = "the-demos-control-key-0123456789abcdef"
LINKED = ("act_1001", "act_1002", "act_1003")


@pytest.fixture
def rastro_environ() -> Mapping[str, str]:
    """No variable names a file: the demo's are found from the working directory."""
    return {}


@pytest.fixture
def running(checkout: DemoPaths):
    """The demo's fake Graph served and named in data/fake-graph.json, as a running demo."""
    world = FakeWorld.demo()
    with serve(world, control_key=KEY) as server:
        write_graph_file(
            checkout.graph_file,
            DemoGraph(server.base_url, server.control_url, KEY, os.getpid()),
        )
        yield world


def requested(paths: DemoPaths) -> dict[str, datetime | None]:
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        return {a.ad_account_id: a.sync_requested_at for a in registry.linked_accounts(con)}


def test_a_throttle_is_staged_a_sync_asked_for_and_taken_away(
    rastro: Rastro, checkout: DemoPaths, running: FakeWorld, now: datetime
):
    code, out, err = rastro("demo", "trouble", "throttle", "act_1003")
    assert (code, err) == (0, "")
    [line] = out.splitlines()
    assert line.startswith("staged throttle act_1003: ")
    assert "rastro status --check" in line and "rastro demo trouble mend throttle" in line
    assert running.throttled_for("act_1003") == 10
    assert requested(checkout) == {"act_1001": None, "act_1002": None, "act_1003": now}

    code, out, _ = rastro("demo", "trouble")
    assert (code, out) == (0, "staged: throttle act_1003 (`rastro demo trouble mend` takes it"
                              " all away)\n")

    later = now + timedelta(minutes=1)
    code, out, _ = rastro("demo", "trouble", "mend", "throttle", at=later)
    assert code == 0 and out.startswith("took away throttle act_1003; a sync of act_1003")
    assert running.throttled_for("act_1003") is None
    assert requested(checkout)["act_1003"] == later
    code, out, _ = rastro("demo", "trouble")
    assert out == "nothing is staged in the running demo's fake Graph\n"


def test_every_kind_stages_on_the_accounts_it_touches(
    rastro: Rastro, checkout: DemoPaths, running: FakeWorld, now: datetime
):
    assert rastro("demo", "trouble", "lost-permission", "1002")[0] == 0
    assert not running.can_read(DEMO_TOKEN, "act_1002")
    assert rastro("demo", "trouble", "slow")[0] == 0
    assert running.overloaded
    code, out, _ = rastro("demo", "trouble", "dead-token")
    assert code == 0 and f"a sync of {', '.join(LINKED)} is asked for" in out
    assert running.token_state(DEMO_TOKEN) == ("dead", 463)

    code, out, _ = rastro("demo", "trouble", "mend")
    assert code == 0
    assert out.startswith("took away dead-token, slow, lost-permission act_1002;")
    # The rehearsal's fix for a dead token is the operator's, as the notice says.
    assert "`rastro connect demo`" in out
    assert running.token_state(DEMO_TOKEN) == ("ok", None)
    assert running.can_read(DEMO_TOKEN, "act_1002") and not running.overloaded
    code, out, _ = rastro("demo", "trouble", "mend")
    assert (code, out) == (0, "nothing is staged in the running demo's fake Graph\n")


@pytest.mark.parametrize(
    "words, says",
    [
        (["flood"], "no trouble kind 'flood'"),
        (["throttle"], "throttle needs the ad account"),
        (["slow", "act_1001"], "slow is about every account"),
        (["throttle", "act_x"], "is not act_<digits>"),
        (["throttle", "act_1003", "again"], "too many words"),
        # The demo token reaches it, but the demo does not link it: nothing would show.
        (["throttle", "act_1004"], "act_1004 is not linked in the demo"),
        (["lost-permission", "act_9999"], "act_9999 is not linked in the demo"),
    ],
)
def test_bad_trouble_is_one_line_and_changes_nothing(
    rastro: Rastro, checkout: DemoPaths, running: FakeWorld, words, says
):
    code, out, err = rastro("demo", "trouble", *words)
    assert (code, out) == (2, "")
    assert err.startswith("rastro: error: ") and says in err and err.count("\n") == 1
    assert requested(checkout) == dict.fromkeys(LINKED)
    assert rastro("demo", "trouble")[1] == "nothing is staged in the running demo's fake Graph\n"


def test_without_a_running_demo_it_names_the_file_it_tried(rastro: Rastro, checkout: DemoPaths):
    code, out, err = rastro("demo", "trouble", "slow")
    assert (code, out) == (2, "")
    assert f"no demo is running here: {checkout.graph_file}" in err
    # A file left by a demo that is gone names no running demo either.
    write_graph_file(checkout.graph_file, DemoGraph("http://127.0.0.1:9/v25.0",
                                                    "http://127.0.0.1:9/_rastro/trouble",
                                                    KEY, pid=2**22 + 1))
    assert rastro("demo", "trouble")[0] == 2
    assert requested(checkout) == dict.fromkeys(LINKED)


def test_the_demo_serves_its_fake_graph_while_dagster_runs(
    checkout: DemoPaths, monkeypatch: pytest.MonkeyPatch, capsys
):
    seen = {}

    def supervise(argv, env, watcher, output, stop_runs=None):
        graph = read_graph_file(checkout.graph_file)
        seen["graph"], seen["env"] = graph, env
        answer = httpx.get(f"{graph.url}/act_1001", params={"fields": "currency"},
                           headers={"Authorization": f"Bearer {DEMO_TOKEN}"})
        seen["answer"] = answer.json()
        seen["refused"] = httpx.get(graph.control_url).status_code
        raise RuntimeError("dagster dev broke")

    monkeypatch.setattr(demo, "supervise", supervise)
    environ = {"RASTRO_META_FAKE": "true", "RASTRO_META_GRAPH_URL": "https://graph.example/v1"}
    with pytest.raises(RuntimeError):
        demo.run(checkout.root, [], environ=environ)
    graph, env = seen["graph"], seen["env"]
    assert graph.pid == os.getpid() and graph.url.startswith("http://127.0.0.1:")
    assert env["RASTRO_META_GRAPH_URL"] == graph.url and "RASTRO_META_FAKE" not in env
    assert seen["answer"] == {"id": "act_1001", "currency": "BRL"}
    assert seen["refused"] == 403
    # Stopped, even by an exception: the file gone, the server closed.
    assert not checkout.graph_file.exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(graph.control_url)
    said = capsys.readouterr().out
    assert f"the fake Meta Graph at {graph.url}" in said
    assert "RASTRO_META_GRAPH_URL and RASTRO_META_FAKE from the environment set aside" in said


def test_a_demo_leaves_the_file_of_another_demo_started_since(checkout: DemoPaths):
    with graph_server.serving(checkout) as ours:
        other = DemoGraph(ours.url, ours.control_url, "another-key-0123456789", os.getpid())
        write_graph_file(checkout.graph_file, other)
    assert read_graph_file(checkout.graph_file) == other
