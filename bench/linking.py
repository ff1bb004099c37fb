"""Linking 1,000 ad accounts in one process, against the fake Graph over loopback HTTP.

An agency's token reaches hundreds of accounts, and a connection holds at most 500 links, so
the 1,000 accounts come through two connections: `rastro link SITE --all --connection C`
once for each, in one process (the console script's `cli.run`), into a fresh DuckDB file.
Each `link` reads `/me/adaccounts` (every page) once, then links in batches of
`LINK_BATCH_ACCOUNTS`, one transaction each.

Timed: the two commands end to end; Meta's share, the wall time spent inside the Graph
session's requests (the fake answers at once unless `--delay-ms` holds each answer back);
what is left, per account, is the figure against its goal. Also printed: the longest a batch
held the warehouse (other processes wait for it meanwhile) and, for comparison, the same
process linking `--singles` accounts one `rastro link SITE ID` at a time, as before.

Measured twice: without DAGSTER_HOME, and with one (a fresh instance, `--shards` shards of
`--shard-accounts`, so the accounts fill several shards' dynamic partitions).

Run: .venv/bin/python bench/linking.py [--accounts 1000] [--delay-ms 0] [--singles 20]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GOAL_SECONDS_PER_ACCOUNT = 0.1
MAX_LINKS = 500


class Timer:
    """Wall time spent inside a patched function (re-entrant calls counted once)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.longest = 0.0
        self.calls = 0
        self._depth = 0

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    spent = time.perf_counter() - started
                    self.seconds += spent
                    self.longest = max(self.longest, spent)
                    self.calls += 1

        return timed


@contextmanager
def patched(owner: Any, name: str, timer: Timer):
    original = getattr(owner, name)
    setattr(owner, name, timer.wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def build_world(accounts: int, tokens: list[str], delay_seconds: float):
    from rastro_fake_graph import FakeWorld

    world = FakeWorld(seed=35)
    world.request_delay_seconds = delay_seconds
    per_token = -(-accounts // len(tokens))
    for index in range(accounts):
        zone, currency = (("America/Sao_Paulo", "BRL"), ("Asia/Tokyo", "JPY"))[index % 2]
        world.add_account(f"act_{700000 + index}", timezone=zone, currency=currency, n_ads=0,
                          name=f"Cliente {index}", token=tokens[index // per_token])
    return world


def rastro(environ: Mapping[str, str], *args: str, stdin: str = "") -> tuple[int, str, str]:
    from rastro_assets import cli
    from rastro_assets.cli.context import Context

    out, err = io.StringIO(), io.StringIO()
    ctx = Context(environ=environ, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return cli.run(list(args), ctx), out.getvalue(), err.getvalue()


def measure(label: str, accounts: int, delay_seconds: float, singles: int,
            dagster_home: Path | None, shards: int, shard_accounts: int) -> float:
    from rastro_assets.meta.session import GraphSession
    from rastro_assets.vault import generate_key
    from rastro_assets.warehouse import registry
    from rastro_fake_graph.server import serve

    connections = -(-accounts // MAX_LINKS)
    tokens = [f"EAAbench{n:02d}LinkingToken0123456789" for n in range(connections + 1)]
    world = build_world(accounts, tokens[:connections], delay_seconds)
    for index in range(singles):
        world.add_account(f"act_{900000 + index}", timezone="UTC", currency="USD", n_ads=0,
                          token=tokens[-1])
    workdir = Path(tempfile.mkdtemp(prefix="rastro-linking-"))
    environ = {
        **os.environ,
        "RASTRO_DUCKDB_PATH": str(workdir / "rastro.duckdb"),
        "RASTRO_SECRETS_KEY": generate_key(),
        "RASTRO_ACCOUNT_SHARDS": str(shards),
        "RASTRO_SHARD_ACCOUNTS": str(shard_accounts),
    }
    environ.pop("RASTRO_META_FAKE", None)
    environ.pop("DAGSTER_HOME", None)
    if dagster_home is not None:
        dagster_home.mkdir(parents=True, exist_ok=True)
        (dagster_home / "dagster.yaml").touch()
        # The instance is found through the process's environment, as the console script's.
        os.environ["DAGSTER_HOME"] = environ["DAGSTER_HOME"] = str(dagster_home)
        import rastro_assets.instance.accounts  # noqa: F401  (Dagster's imports, outside the timing)
    else:
        os.environ.pop("DAGSTER_HOME", None)
    meta, hold = Timer(), Timer()
    with serve(world) as server:
        environ["RASTRO_META_GRAPH_URL"] = server.base_url
        assert rastro(environ, "site", "add", "agency")[0] == 0
        for index, token in enumerate(tokens):
            code, _, err = rastro(environ, "connect", f"c{index}", "--no-verify", stdin=token)
            assert code == 0, err
        with patched(GraphSession, "call", meta), patched(registry, "link_accounts", hold):
            started = time.perf_counter()
            for index in range(connections):
                code, out, err = rastro(environ, "link", "agency", "--all", "--connection",
                                        f"c{index}")
                assert code == 0, err
                print(f"  {out.splitlines()[-1]}")
            total = time.perf_counter() - started
            single_meta = meta.seconds
            batches, longest_hold = hold.calls, hold.longest
            singles_started = time.perf_counter()
            for index in range(singles):
                code, _, err = rastro(environ, "link", "agency", f"act_{900000 + index}",
                                      "--connection", f"c{connections}")
                assert code == 0, err
            single_total = time.perf_counter() - singles_started
    os.environ.pop("DAGSTER_HOME", None)
    beyond = (total - single_meta) / accounts
    print(f"{label}: {accounts} accounts in {total:.2f} s, Meta's answers {single_meta:.2f} s"
          f" ({world.calls['adaccounts']} listing pages); beyond Meta"
          f" {beyond * 1000:.1f} ms an account (goal <= {GOAL_SECONDS_PER_ACCOUNT * 1000:.0f})")
    print(f"  {batches} batches, the longest held the warehouse {longest_hold * 1000:.0f} ms")
    if singles:
        print(f"  one id a command, same process: {single_total / singles * 1000:.0f} ms an"
              f" account ({singles} accounts, {meta.seconds - single_meta:.2f} s of it Meta's)")
    return beyond


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="hold each of the fake's answers back this long (Meta's latency)")
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--shard-accounts", type=int, default=100)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    delay = args.delay_ms / 1000
    plain = measure("without DAGSTER_HOME", args.accounts, delay, args.singles, None, 1, 100)
    home = Path(tempfile.mkdtemp(prefix="rastro-linking-home-"))
    with_home = measure(
        f"with DAGSTER_HOME ({args.shards} shards of {args.shard_accounts})", args.accounts,
        delay, args.singles, home, args.shards, args.shard_accounts,
    )
    worst = max(plain, with_home)
    print(f"linking: {worst * 1000:.1f} ms an account beyond Meta's answers"
          f" (goal <= {GOAL_SECONDS_PER_ACCOUNT * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
