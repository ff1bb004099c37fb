"""`rastro rotate-key`, `rastro publish`, `rastro demo` (and `rastro demo trouble`) and
`rastro fake-meta`.

`rotate-key` re-seals every stored token under a new secrets key in one
transaction: either every token opens under the new key afterwards, or
nothing changed. `publish` publishes the analytics snapshot now, without
Dagster. `demo` and `fake-meta` run the product on the fake Graph.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
from pathlib import Path

from rastro_assets.cli.context import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    Context,
    Parser,
    Registrar,
    Subparsers,
    UsageError,
    command,
)
from rastro_assets.outcomes import counted
from rastro_assets.settings import RASTRO_SECRETS_KEY, project_root
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault
from rastro_assets.warehouse.connection import Connection, transaction
from rastro_assets.warehouse.registry import sealed_tokens, store_resealed_tokens

# rotate-key -----------------------------------------------------------------


def add_rotate_key(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "rotate-key",
        _rotate_key,
        f"re-seal every stored token under the key in {ENV_VAR}, opening each with the old key",
    )
    parser.add_argument(
        "--old-key-env",
        required=True,
        metavar="VAR",
        help=f"the environment variable holding the old key (the new one is {ENV_VAR})",
    )


def _rotate_key(args: argparse.Namespace, ctx: Context) -> int:
    old_var = args.old_key_env.strip()
    old, new = _old_and_new_vaults(ctx, old_var)
    warehouse = ctx.warehouse()
    if not warehouse.exists():
        ctx.say(f"no warehouse at {warehouse.location}: no token to re-seal")
        return EXIT_OK
    with warehouse.connect() as con, transaction(con):
        resealed, already = _reseal_all(con, ctx, old, new, old_var)
        store_resealed_tokens(con, resealed, ctx.now())
    ctx.say(f"re-sealed {counted(len(resealed), 'token')} under {ENV_VAR}")
    if already:
        names = ", ".join(already)
        were = "was" if len(already) == 1 else "were"
        ctx.say(f"{counted(len(already), 'token')} {were} sealed under {ENV_VAR} already: {names}")
    ctx.say(
        f"restart dagster-daemon, dagster-webserver and the run workers with the new {ENV_VAR};"
        f" {old_var} opens nothing any more"
    )
    return EXIT_OK


def _old_and_new_vaults(ctx: Context, old_var: str) -> tuple[Vault, Vault]:
    """The vaults of the old key (in `old_var`) and the new one; UsageError unless both
    hold a key and the keys differ."""
    if not old_var:
        raise UsageError("--old-key-env needs the name of an environment variable")
    if old_var == ENV_VAR:
        raise UsageError(
            f"--old-key-env names {ENV_VAR}, which holds the new key: put the old key in"
            " another variable (for example RASTRO_OLD_SECRETS_KEY)"
        )
    try:
        old = Vault.from_env(ctx.environ, var=old_var)
    except SecretsKeyError:
        raise UsageError(
            f"--old-key-env {old_var}: that variable must hold the old key, the base64 of"
            " 32 bytes, as RASTRO_SECRETS_KEY did before"
        ) from None
    if not RASTRO_SECRETS_KEY.is_set(ctx.environ):
        # The new key is the one exported, never one a folder stands in for.
        raise UsageError(
            f"{ENV_VAR} is not set: export the new key as {ENV_VAR} (`rastro keygen` makes"
            f" one), and the old one as {old_var}"
        )
    new = Vault.from_env(ctx.environ)
    if _key_bytes(ctx, old_var) == _key_bytes(ctx, ENV_VAR):
        raise UsageError(
            f"{old_var} and {ENV_VAR} hold the same key: export the new key (`rastro keygen`)"
            f" as {ENV_VAR} first"
        )
    return old, new


def _reseal_all(
    con: Connection, ctx: Context, old: Vault, new: Vault, old_var: str
) -> tuple[list[tuple[str, bytes]], list[str]]:
    """Every stored token sealed under the new key, and the connections whose token was
    sealed under it already. Writes nothing: a token that opens under neither key would be
    lost, so it stops the whole rotation (UsageError)."""
    resealed: list[tuple[str, bytes]] = []
    already: list[str] = []
    unreadable: list[str] = []
    for connection_id, sealed in sealed_tokens(con):
        try:
            token = old.open(connection_id, sealed)
        except SecretsKeyError:
            if _opens(new, connection_id, sealed):
                already.append(connection_id)
            else:
                unreadable.append(connection_id)
            continue
        ctx.keep_secret(token)
        resealed.append((connection_id, new.seal(connection_id, token)))
    if unreadable:
        names = ", ".join(repr(name) for name in unreadable)
        raise UsageError(
            f"the token of {'connection' if len(unreadable) == 1 else 'connections'} {names}"
            f" opens under neither {old_var} nor"
            f" {ENV_VAR}; nothing was changed (reconnect those with `rastro connect`,"
            " or find the key they were sealed with)"
        )
    return resealed, already


def _key_bytes(ctx: Context, var: str) -> bytes:
    return base64.b64decode((ctx.environ.get(var) or "").strip(), validate=True)


def _opens(vault: Vault, connection_id: str, sealed: bytes) -> bool:
    try:
        vault.open(connection_id, sealed)
    except SecretsKeyError:
        return False
    return True


# publish --------------------------------------------------------------------


def add_publish(subparsers: Subparsers) -> None:
    command(
        subparsers,
        "publish",
        _publish,
        "publish the analytics snapshot now (the pipeline does within minutes of a write)",
    )


def _publish(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here: only this command copies the warehouse.
    from rastro_assets.analytics.publish import Publisher, PublishError

    warehouse = ctx.warehouse()
    if not warehouse.exists():
        raise UsageError(f"no warehouse at {warehouse.location}: nothing to publish")
    publisher = Publisher.from_settings(ctx.settings(), warehouse, ctx.clock)
    try:
        result = publisher.publish()
    except PublishError as exc:
        return ctx.fail(f"the snapshot was not published: {exc}", EXIT_FAILED)
    if result is None:
        ctx.say(
            f"another process is publishing {publisher.target} right now: its snapshot"
            " carries what this one would have"
        )
        return EXIT_OK
    ctx.say(f"published {result.path}: {result.bytes} bytes in {result.duration_seconds:.2f} s")
    return EXIT_OK


# fake-meta ------------------------------------------------------------------

FAKE_META_PORT = 8765  # the server's DEFAULT_PORT, without importing the fake to build --help


def add_fake_meta(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "fake-meta",
        _fake_meta,
        "serve the fake Meta Graph (the demo accounts) over HTTP on loopback until Ctrl-C",
    )
    parser.add_argument(
        "--port", type=int, default=FAKE_META_PORT, help=f"port (default {FAKE_META_PORT}; 0: any)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)"
    )


def _fake_meta(args: argparse.Namespace, ctx: Context) -> int:
    host = loopback_host(args.host)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port number (0-65535)")
    from rastro_fake_graph.server import run_server

    try:
        run_server(args.port, host=host)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{args.port}: {exc.strerror or exc}") from None
    return EXIT_OK


def loopback_host(raw: str) -> str:
    """`raw` when it is a loopback address (`localhost` is 127.0.0.1); UsageError otherwise.

    The fake answers any token for the demo accounts: it must never be
    reachable from another machine.
    """
    text = raw.strip().strip("[]")
    if text.lower() == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise UsageError(
            f"--host {raw!r} is not an IP address: the fake Graph binds loopback only"
            " (127.0.0.1 or ::1)"
        ) from None
    if not address.is_loopback:
        raise UsageError(
            f"--host {raw!r} is not a loopback address: the fake Graph binds loopback only"
            " (127.0.0.1 or ::1)"
        )
    return str(address)


# demo -----------------------------------------------------------------------


TROUBLE = "trouble"
TROUBLE_HELP = (
    "stage trouble in the running demo's fake Graph, or take it away: `rastro demo trouble"
    " dead-token | throttle ACCOUNT | slow | lost-permission ACCOUNT`, `rastro demo trouble"
    " mend [KIND [ACCOUNT]]`; alone, it lists what is staged"
)


def add_demo(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "demo",
        _demo,
        "create or reuse the demo in data/ (fake Graph, 2 sites, 3 accounts) and start"
        " Dagster on it; run from the repo root",
    )
    parser.epilog = f"rastro demo {TROUBLE}: {TROUBLE_HELP}"
    parser.add_argument("--port", type=int, help="the Dagster UI's port (default 3000)")
    parser.add_argument(
        "dagster_args",
        nargs=argparse.REMAINDER,
        metavar="-- DAGSTER_DEV_ARGS",
        help="more arguments for `dagster dev`, after --",
    )


def _demo(args: argparse.Namespace, ctx: Context) -> int:
    from rastro_assets import demo

    # Like every command, from anywhere inside the checkout.
    root = project_root()
    if root is None or not (root / "dagster.yaml").exists():
        raise UsageError(
            f"rastro demo runs in a checkout of rastro_assets (its repo root or below), and"
            f" {Path.cwd()} is in none: no workspace.yaml and dagster.yaml of this project"
            " from there upward"
        )
    extra = list(args.dagster_args)
    if extra[:1] == [TROUBLE]:
        if args.port is not None:
            raise UsageError(f"rastro demo {TROUBLE} takes no --port")
        return _trouble(root, extra[1:], ctx)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if args.port is not None:
        extra = ["--port", str(args.port), *extra]
    return demo.run(root, extra, environ=ctx.environ)


def _trouble(root: Path, words: list[str], ctx: Context) -> int:
    parser = Parser(prog=f"{PROG} demo {TROUBLE}", description=TROUBLE_HELP)
    parser.add_argument("words", nargs="*", metavar="KIND|mend [ACCOUNT]")
    # Only for --help: the words are read below, where each mistake gets its own line.
    parser.parse_args([word for word in words if word in ("-h", "--help")])
    from rastro_assets.demo.trouble import TroubleError, trouble

    try:
        said = trouble(root, words, ctx.now())
    except TroubleError as exc:
        raise UsageError(str(exc)) from None
    for line in said:
        ctx.say(line)
    return EXIT_OK


REGISTRARS: list[Registrar] = [add_rotate_key, add_publish, add_demo, add_fake_meta]
