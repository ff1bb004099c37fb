"""One way to run `rastro` in-process, on the test's warehouse of either engine, and one way
to check its usage errors."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rastro_assets import cli, demo
from rastro_assets.cli.context import Context
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.timekeeping import fixed_clock
from rastro_assets.warehouse import engines

Rastro = Callable[..., tuple[int, str, str]]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def rastro_environ(duckdb_path: Path) -> Mapping[str, str]:
    """The environment every run sees (a module overrides this fixture to change it)."""
    return {"RASTRO_DUCKDB_PATH": str(duckdb_path)}


@pytest.fixture
def checkout(tmp_path: Path, now: datetime, monkeypatch: pytest.MonkeyPatch) -> DemoPaths:
    """A checkout where `rastro demo` has prepared data/, as the working directory."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO / name, root / name)
    paths = DemoPaths(root)
    demo.prepare(paths, now=now, environ={})
    monkeypatch.chdir(root)
    return paths


@pytest.fixture
def never_printed() -> Collection[str]:
    """Secrets no run may print on stdout or stderr (a module overrides this with its own)."""
    return ()


def engine_environ(request: pytest.FixtureRequest) -> dict[str, str]:
    """RASTRO_WAREHOUSE_URL, password and all, when the test's `warehouse` is on PostgreSQL:
    a command then reaches the very schema the test filled. Nothing for a DuckDB file."""
    if "warehouse" not in request.fixturenames:
        return {}
    url = getattr(request.getfixturevalue("warehouse"), "url_with_password", None)
    return {"RASTRO_WAREHOUSE_URL": url} if url else {}


@pytest.fixture
def rastro(
    rastro_environ: Mapping[str, str],
    never_printed: Collection[str],
    now: datetime,
    request: pytest.FixtureRequest,
) -> Iterator[Rastro]:
    """Run `rastro ARGS` in-process; (exit code, stdout, stderr).

    `stdin` is what the command reads, `at` the instant its clock shows (the
    pinned `now` by default), and `environ` adds to or overrides `rastro_environ`,
    read at the call. A test whose `warehouse` is on PostgreSQL runs every command on it,
    and no command may print the server's password.
    """
    on_engine = engine_environ(request)
    url = on_engine.get("RASTRO_WAREHOUSE_URL")
    secrets = [*never_printed, *filter(None, [url and urlsplit(url).password])]

    def run(
        *args: str,
        stdin: str = "",
        at: datetime = now,
        environ: Mapping[str, str] | None = None,
    ) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        ctx = Context(
            environ={**rastro_environ, **on_engine, **(environ or {})},
            stdin=io.StringIO(stdin),
            stdout=out,
            stderr=err,
            clock=fixed_clock(at),
        )
        code = cli.run(list(args), ctx)
        for secret in secrets:
            assert secret not in out.getvalue() + err.getvalue()
        return code, out.getvalue(), err.getvalue()

    yield run
    if url is not None:
        # The commands' pool for the test's schema: closed with the test, not the session.
        pool = engines._POOLS.pop(url, None)
        if pool is not None:
            pool.close()


def assert_usage_error(result: tuple[int, str, str], *fragments: str) -> str:
    """Exit 2, nothing on stdout, one `rastro: error:` line holding every fragment; the line."""
    code, out, err = result
    assert (code, out) == (2, ""), (out, err)
    [line] = err.splitlines()
    assert line.startswith("rastro: error: ")
    for fragment in fragments:
        assert fragment in line, line
    return line
