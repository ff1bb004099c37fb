"""The client over real sockets against the loopback server, and `make_client`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import httpx
import pytest

from rastro_assets.meta import FAKE_GRAPH_BASE_URL, make_client
from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.process_settings import Settings
from rastro_assets_tests.insight_rows import chunk_rows
from rastro_assets_tests.meta.conftest import BRL, TOKEN, truth_rows
from rastro_fake_graph import DEMO_TOKEN, FakeWorld, serve

PAST_DAY = date(2026, 2, 10)
REPO_ROOT = Path(__file__).resolve().parents[2]


def socket_client(base_url: str, **kwargs) -> MetaClient:
    kwargs.setdefault("sleep", lambda seconds: None)
    return MetaClient(TOKEN, base_url=base_url, **kwargs)


def test_client_over_real_sockets(world: FakeWorld) -> None:
    with serve(world) as server, socket_client(server.base_url, page_size=6) as client:
        assert server.base_url.startswith("http://127.0.0.1:")
        client.check_token()
        assert client.account(BRL).currency == "BRL"
        since, until = date(2026, 3, 1), date(2026, 3, 6)
        chunks = list(client.insights(BRL, since, until))
        assert {r for c in chunks for r in chunk_rows(c)} == truth_rows(world, BRL, since, until)
        assert world.calls["insights"] > 3
        ads = list(client.ads(BRL))
        ad = next(ad for ad in ads if ad.thumbnail_url)
        assert ad.thumbnail_url.startswith(f"{server.origin}/fake-cdn/thumb/")
        assert client.thumbnail(ad.thumbnail_url).data == world.thumbnail_bytes(ad.ad_id)
        assert [a.ad_id for a in client.ads_by_id([ad.ad_id, "999000"])] == [ad.ad_id]


def test_split_and_async_over_sockets(world: FakeWorld) -> None:
    world.row_cap = 4
    with serve(world) as server, socket_client(server.base_url) as client:
        since, until = date(2026, 3, 1), date(2026, 3, 3)
        chunks = list(client.insights(BRL, since, until))
    assert [c.since for c in chunks] == [since, date(2026, 3, 2), until]
    assert all(c.complete for c in chunks)
    assert world.calls["async"] == 3


def test_errors_over_sockets(world: FakeWorld) -> None:
    world.server_stall_seconds = 1.0
    with serve(world) as server, socket_client(server.base_url, timeout_seconds=0.3,
                                               max_retries=0) as client:
        world.fail("account", "timeout")
        started = time.monotonic()
        with pytest.raises(MetaError) as caught:
            client.account(BRL)
        assert caught.value.kind is ErrorKind.TRANSIENT
        assert "did not answer" in str(caught.value)
        assert time.monotonic() - started < 1.0

        world.fail("account", "dropped")
        with pytest.raises(MetaError) as caught:
            client.account(BRL)
        assert caught.value.kind is ErrorKind.TRANSIENT
        assert "connection to Meta failed" in str(caught.value)

        world.fail("account", "http5xx_html")
        with pytest.raises(MetaError) as caught:
            client.account(BRL)
        assert "HTML page instead of JSON" in str(caught.value)

        world.fail("account", "throttled", regain_minutes=30)
        with pytest.raises(MetaError) as caught:
            client.account(BRL)
        assert (caught.value.kind, caught.value.regain_seconds) == (ErrorKind.THROTTLED, 1800)
        assert TOKEN not in str(caught.value)
        assert client.account(BRL).timezone == "America/Sao_Paulo"


def test_server_binds_loopback_only(world: FakeWorld) -> None:
    for host in ("0.0.0.0", "192.0.2.1"):
        with pytest.raises(ValueError):
            serve(world, host=host)


def test_make_client_fake_and_real() -> None:
    with make_client(Settings(use_fake_graph=True), DEMO_TOKEN,
                     sleep=lambda seconds: None) as client:
        assert repr(client) == f"MetaClient(base_url={FAKE_GRAPH_BASE_URL!r})"
        account = client.account("act_1002")
        assert (account.currency, account.timezone) == ("JPY", "Asia/Tokyo")
        assert client.insights("act_1003", PAST_DAY, PAST_DAY)
    settings = Settings(graph_url="http://127.0.0.1:9/v25.0")
    with make_client(settings, "EAAsomething", timeout_seconds=1, max_retries=0) as client:
        assert "127.0.0.1:9" in repr(client)
        with pytest.raises(MetaError) as caught:
            client.check_token()
        assert caught.value.kind is ErrorKind.TRANSIENT


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_run_server_serves_the_same_demo_world_in_another_process() -> None:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-c",
         f"from rastro_fake_graph import run_server; run_server({port})"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
    )
    try:
        banner = process.stdout.readline() if process.stdout else ""
        assert f"http://127.0.0.1:{port}/v25.0" in banner
        base_url = f"http://127.0.0.1:{port}/v25.0"
        with MetaClient(DEMO_TOKEN, base_url=base_url, sleep=lambda s: None) as client:
            remote = [r for c in client.insights("act_1003", PAST_DAY, PAST_DAY)
                      for r in chunk_rows(c)]
        local = FakeWorld.demo().truth("act_1003", PAST_DAY)
        assert remote and set(remote) == set(local)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # seen once on a loaded machine: never hang the suite
            process.kill()
            process.wait(timeout=10)


def test_server_answers_unknown_paths_like_meta(world: FakeWorld) -> None:
    with serve(world) as server:
        response = httpx.get(f"{server.base_url}/nothing/here",
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == 100
