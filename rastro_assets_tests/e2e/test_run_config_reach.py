"""What a Dagster UI user can reach through run config: nothing the environment fixes.

Dagster OSS has no login: whoever reaches the webserver launches runs from the Launchpad,
whose YAML may hold resource config. Here a real `dagster-webserver` serves the product's
code location over a warehouse with a linked account and its sealed token, and the UI's own
`LaunchPipelineExecution` mutation (read from the installed bundle, as the Launchpad sends it)
launches the wave job with each override an attacker would try: the token sent to their
listener, the warehouse or the snapshot moved to a file of their choice, the fake Graph
switched on or off. Each launch must be refused before a run exists, the listener must hear
nothing and the victim file must keep its bytes.

The instance launches runs at once (`DefaultRunCoordinator`) rather than queueing them for
a daemon: a launch that got through would run within the test, so the listener and the
victim file show what it reached.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from rastro_assets.timekeeping import local_date
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    REPO,
    TIMEZONE,
    instance_yaml,
    linked_warehouse,
    one_account_world,
)
from rastro_assets_tests.e2e.webserver_harness import LOCATION, graphql, webserver
from rastro_fake_graph.server import serve

pytestmark = pytest.mark.slow

JOB = "meta_sync_wave"
RUN_END_SECONDS = 60
VICTIM_BYTES = b"an operator's file that no run may replace\n"
FROM_UI = {"key": "dagster/from_ui", "value": "true"}


def launch_mutation() -> str:
    """The Launchpad's `LaunchPipelineExecution` (RunUtils.tsx), with the `__typename` the
    UI's Apollo client adds to every selection."""
    spec = importlib.util.spec_from_file_location("bench_ui", REPO / "bench" / "_ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts, _, notes = module.extract_operations(("LaunchPipelineExecution",))
    assert "LaunchPipelineExecution" in texts, notes
    field = "launchPipelineExecution(executionParams: $executionParams) {"
    assert field in texts["LaunchPipelineExecution"]
    return texts["LaunchPipelineExecution"].replace(field, field + "\n    __typename")


class Listener:
    """An HTTP server on loopback that answers 200 and remembers every request."""

    def __init__(self) -> None:
        heard = self.heard = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                heard.append((self.command, self.path, dict(self.headers)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v25.0"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def runs(url: str) -> list[dict]:
    data = graphql(url, "{ runsOrError { ... on Runs { results { runId status } } } }")
    return data["runsOrError"]["results"]


def wait_for_runs_to_end(url: str) -> None:
    """Lets a run that was launched all the same do what it came for, before the checks."""
    deadline = time.monotonic() + RUN_END_SECONDS
    ending = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
    while any(run["status"] in ending for run in runs(url)) and time.monotonic() < deadline:
        time.sleep(1)


@pytest.fixture
def victim(tmp_path) -> Path:
    victim = tmp_path / "operator" / "precious.txt"
    victim.parent.mkdir()
    victim.write_bytes(VICTIM_BYTES)
    return victim


@pytest.fixture
def location_env(tmp_path, secrets_key) -> Iterator[dict[str, str]]:
    """The code location's environment: a warehouse with the account linked and its token
    sealed, its snapshot, and the fake Graph serving the account; the instance in a new
    `DAGSTER_HOME`."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = instance_yaml(home)
    config["run_coordinator"] = {
        "module": "dagster.core.run_coordinator",
        "class": "DefaultRunCoordinator",
    }
    config.pop("concurrency", None)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    warehouse, snapshot = linked_warehouse(tmp_path, [ACCOUNT], TIMEZONE, "NZD")
    with serve(one_account_world()) as graph:
        env = {
            key: value for key, value in os.environ.items() if not key.startswith("RASTRO_")
        }
        yield {
            **env,
            "DAGSTER_HOME": str(home),
            "RASTRO_SECRETS_KEY": secrets_key,
            "RASTRO_DUCKDB_PATH": str(warehouse.path),
            "RASTRO_ANALYTICS_PATH": str(snapshot),
            "RASTRO_META_GRAPH_URL": graph.base_url,
        }


def wave_yaml(overrides: dict) -> str:
    """The Launchpad's YAML: a valid manual wave of the linked account, and `overrides` as the
    resource's config."""
    today = local_date(datetime.now(UTC), TIMEZONE)
    sync = {
        "ad_account_id": ACCOUNT,
        "kind": "manual",
        "since": (today - timedelta(days=1)).isoformat(),
        "until": today.isoformat(),
    }
    config = {
        "ops": {"sync_wave": {"config": {"syncs": [sync]}}},
        "resources": {"rastro": {"config": overrides}},
    }
    return yaml.safe_dump(config)


def test_run_config_reaches_no_server_and_no_file(tmp_path, location_env, victim):
    stolen = tmp_path / "attacker" / "rastro.duckdb"
    stolen.parent.mkdir()
    with Listener() as listener:
        attacks = {
            "graph_url": {"graph_url": listener.url},
            "duckdb_path": {"duckdb_path": str(stolen)},
            "analytics_path": {"analytics_path": str(victim)},
            "use_fake_graph": {"use_fake_graph": True},
            "all of them": {
                "graph_url": listener.url,
                "duckdb_path": str(stolen),
                "analytics_path": str(victim),
                "use_fake_graph": False,
            },
        }
        mutation = launch_mutation()
        answers = {}
        with webserver(location_env, tmp_path / "webserver.log") as url:
            for name, overrides in attacks.items():
                params = {
                    "runConfigData": wave_yaml(overrides),
                    "selector": {
                        "repositoryLocationName": LOCATION,
                        "repositoryName": "__repository__",
                        "pipelineName": JOB,
                        "assetSelection": [],
                        "assetCheckSelection": [],
                    },
                    "mode": "default",
                    "executionMetadata": {"tags": [FROM_UI]},
                }
                answers[name] = graphql(url, mutation, {"executionParams": params})[
                    "launchPipelineExecution"
                ]
            wait_for_runs_to_end(url)
            launched = runs(url)

    refused = {
        name: answer["__typename"] == "RunConfigValidationInvalid"
        for name, answer in answers.items()
    }
    assert all(refused.values()), answers
    for name, answer in answers.items():
        # The Launchpad shows each error's message: one line naming what it refused.
        [line] = [error["message"] for error in answer["errors"]]
        assert "\n" not in line, line
        assert line.startswith("Received unexpected config entr"), line
        assert "root:resources:rastro:config" in line, line
        assert all(field in line for field in attacks[name]), line
    assert launched == []
    assert listener.heard == []
    assert victim.read_bytes() == VICTIM_BYTES
    assert not stolen.exists()
