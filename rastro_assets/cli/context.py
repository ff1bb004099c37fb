"""What every `rastro` command stands on: `Context`, `command()`, `UsageError`, exit codes.

Each subcommand is a `Registrar` (adds its parser) plus a `Handler` (does the
work with a `Context`). This module imports no command, so every command
module imports it and `rastro_assets.cli` imports them all, with no cycle.

Bad input of any kind, argparse's included, ends as exactly one line on
stderr, `rastro: error: ...`, and exit code 2, before anything is written.
No token ever reaches stdout, stderr or argv: tokens come from stdin or a
named environment variable, and every error line is scrubbed of them.

In the demo's folder (its checkout, on its `data/rastro.duckdb`) a command needs no
exports: with `RASTRO_SECRETS_KEY`, `RASTRO_META_GRAPH_URL` and `RASTRO_META_FAKE` unset it
takes the demo's key, `data/secrets.key`, as `rastro demo` gives its daemon, and asks the
demo's fake Graph (the running demo's server, else the demo world in this process). Decided
once per command (`demo_folder`), and said in one `rastro: note:` line on stderr, unless the
command is refused. Anywhere else, or with one of those variables set, neither is.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from rastro_assets.process_settings import Settings
from rastro_assets.settings import RASTRO_META_FAKE, RASTRO_META_GRAPH_URL, environment
from rastro_assets.timekeeping import Clock, system_clock
from rastro_assets.tokens import TOKEN_SHAPED
from rastro_assets.vault import (
    ENV_VAR,
    SecretsKeyError,
    Vault,
    missing_key_message,
    read_key_file,
)
from rastro_assets.warehouse.engines import AnyWarehouse, open_warehouse

if TYPE_CHECKING:
    from rastro_assets.demo.paths import DemoPaths
    from rastro_assets.meta.client import MetaClient

PROG = "rastro"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

REDACTED = "[redacted]"
DEMO_UNSET = (ENV_VAR, RASTRO_META_GRAPH_URL.name, RASTRO_META_FAKE.name)
"""Any one set says which key or which Graph: then a command takes nothing of the demo's."""


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


@dataclass(frozen=True)
class DemoFolder:
    """What a command run in the demo's folder takes for what is not exported."""

    key_file: Path
    """The demo's key, the one `rastro demo` gives its daemon when RASTRO_SECRETS_KEY is
    unset."""
    graph_file: Path
    """Where the running demo names its fake Graph."""
    graph_url: str | None
    """The running demo's fake Graph; None: the demo world in this process."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """What the demo's Dagster runs with, taken where the environment does not set it."""

    def note(self) -> str:
        key = shown_path(self.key_file)
        graph = (
            f"the running demo's fake Meta Graph at {self.graph_url}"
            if self.graph_url
            else f"the demo's fake Meta Graph, in this process ({shown_path(self.graph_file)}"
            " names no running demo's)"
        )
        return f"in the demo's folder with nothing exported: the demo's key {key} and {graph}"


def shown_path(path: Path) -> str:
    """`path` as the user finds it: relative to the working directory when inside it."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def is_set(environ: Mapping[str, str], name: str) -> bool:
    return bool((environ.get(name) or "").strip())


_UNDECIDED = object()


@dataclass
class Context:
    """What a handler may touch: the environment, the streams and the clock."""

    environ: Mapping[str, str]
    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    clock: Clock = system_clock
    secrets: list[str] = field(default_factory=list, repr=False)
    _demo: object = field(default=_UNDECIDED, init=False, repr=False, compare=False)
    _demo_noted: bool = field(default=False, init=False, repr=False, compare=False)
    _held_note: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_process(cls) -> Context:
        return cls(environ=environment(), stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr)

    def settings(self) -> Settings:
        return Settings.from_env(dict(self.environ))

    def warehouse(self) -> AnyWarehouse:
        """The database of RASTRO_WAREHOUSE_URL; else the pipeline's file, named by
        RASTRO_DUCKDB_PATH or found from the working directory upward; one error line
        naming the path tried when neither."""
        return open_warehouse(self.settings(), require_path=True)

    def environment(self) -> Mapping[str, str]:
        """The environment; in the demo's folder, with what the demo's Dagster runs with for
        what it leaves unset (its Dagster home, its alert thresholds)."""
        folder = self.demo_folder()
        if folder is None:
            return self.environ
        unset = {
            name: value for name, value in folder.settings.items() if not is_set(self.environ, name)
        }
        return {**self.environ, **unset}

    def vault(self) -> Vault:
        """The vault of RASTRO_SECRETS_KEY; in the demo's folder with it unset, of the demo's
        key. Otherwise SecretsKeyError, saying which key would fix it."""
        if is_set(self.environ, ENV_VAR):
            return Vault.from_env(self.environ)
        folder = self.demo_folder()
        if folder is not None:
            self._note_demo(folder)
            # Named after the file in every refusal: the variable is not what was read.
            shown = shown_path(folder.key_file)
            return Vault.from_env({shown: read_key_file(folder.key_file)}, var=shown)
        raise SecretsKeyError(self._missing_key())

    def open_token(self, connection_id: str, sealed: bytes) -> str:
        """The connection's token, opened with `vault()` and kept secret from every line;
        SecretsKeyError saying which key opens it when that one does not."""
        vault = self.vault()
        try:
            token = vault.open(connection_id, sealed)
        except SecretsKeyError:
            raise SecretsKeyError(self._wrong_key(connection_id, sealed)) from None
        self.keep_secret(token)
        return token

    def demo_folder(self) -> DemoFolder | None:
        """What this command takes from the demo's folder, decided at its first call; None
        when one of `DEMO_UNSET` is set, or the warehouse is not the demo's seen from its
        checkout."""
        if self._demo is _UNDECIDED:
            self._demo = self._find_demo_folder()
        return self._demo  # type: ignore[return-value]

    def _find_demo_folder(self) -> DemoFolder | None:
        if self._exported():
            return None
        paths = self._demo_paths()
        if paths is None:
            return None
        from rastro_assets import demo
        from rastro_assets.demo.graph import read_graph_file

        graph = read_graph_file(paths.graph_file)
        return DemoFolder(
            paths.key_file,
            paths.graph_file,
            graph.url if graph else None,
            demo.folder_settings(paths),
        )

    def _exported(self) -> list[str]:
        """Those of `DEMO_UNSET` that are set."""
        return [name for name in DEMO_UNSET if is_set(self.environ, name)]

    def _demo_paths(self) -> DemoPaths | None:
        """The demo's files, when this command's warehouse is the demo's seen from its
        checkout (whatever is exported)."""
        settings = self.settings()
        if settings.warehouse_url is not None:
            return None
        # Imported here: the demo module loads the planner and the fake Graph's world.
        from rastro_assets import demo

        return demo.demo_folder_paths(settings.duckdb_path)

    def _note_demo(self, folder: DemoFolder) -> None:
        if not self._demo_noted:
            self._demo_noted = True
            self._held_note = folder.note()

    def _missing_key(self) -> str:
        """Why RASTRO_SECRETS_KEY is needed here, and which key to export."""
        from rastro_assets import demo

        paths = self._demo_paths()
        if paths is not None:  # the demo's folder, but with a Graph variable set
            return (
                f"{ENV_VAR} is not set, and the demo's key {shown_path(paths.key_file)} is taken"
                " in the demo's folder only with nothing exported: `unset"
                f" {' '.join(self._exported())}` (its fake Graph is taken then too), or export"
                f" {ENV_VAR} with the key the demo's daemon runs with"
            )
        settings = self.settings()
        strays = [] if settings.warehouse_url else demo.stray_key_files(settings.duckdb_path)
        if strays:
            return (
                f"{ENV_VAR} is not set, and {shown_path(strays[0])} is the demo's key: it"
                " stands in only inside the demo's checkout, for its warehouse"
                " data/rastro.duckdb, and this command's warehouse is"
                f" {os.path.abspath(settings.duckdb_path)}; export {ENV_VAR} with the key the"
                " daemon of that warehouse runs with"
            )
        return missing_key_message()

    def _wrong_key(self, connection_id: str, sealed: bytes) -> str:
        """What opens the connection's token when the key taken does not."""
        folder = self.demo_folder()
        if folder is not None:
            # Not "export that key": with it set, the command would leave the demo's fake Graph.
            from rastro_assets.demo import DEMO_CONNECTION

            restart = (
                "; or restart `rastro demo` with nothing exported, which does it"
                if connection_id == DEMO_CONNECTION
                else ""
            )
            return (
                f"{shown_path(folder.key_file)}, the demo's key, does not open the token of"
                f" connection {connection_id!r}: it was sealed under another key (one"
                " `rastro demo` was started with, or one exported for `rastro connect`); seal it"
                f" again here with nothing exported: `rastro connect {connection_id}`{restart}"
            )
        refusal = f"{ENV_VAR} does not open this token (connection {connection_id!r})"
        demo_key = self._demo_key_opening(connection_id, sealed)
        if demo_key is not None:
            return (
                f"{refusal}: it is sealed with the demo's key {shown_path(demo_key)}, which the"
                " demo's folder takes when nothing is exported:"
                f" `unset {' '.join(self._exported())}`"
            )
        return (
            f"{refusal}: export the key the daemon of this warehouse runs with, the one the"
            " token was sealed with (a fresh `rastro keygen` key opens no stored token); if that"
            f" key is lost, seal the token again: `rastro connect {connection_id}`"
        )

    def _demo_key_opening(self, connection_id: str, sealed: bytes) -> Path | None:
        """The demo's key file, when this is the demo's warehouse seen from its checkout and
        that key opens the token."""
        paths = self._demo_paths()
        if paths is None:
            return None
        try:
            Vault.from_env({ENV_VAR: read_key_file(paths.key_file)}).open(connection_id, sealed)
        except SecretsKeyError:
            return None
        return paths.key_file

    def now(self) -> datetime:
        return self.clock()

    def keep_secret(self, secret: str) -> None:
        """Scrub `secret` from every line this command prints from now on."""
        if secret:
            self.secrets.append(secret)

    def say(self, line: str) -> None:
        self.release_note()
        print(self.scrub(line), file=self.stdout)

    def warn(self, line: str) -> None:
        self.release_note()
        print(f"{PROG}: warning: {self.scrub(line)}", file=self.stderr)

    def release_note(self) -> None:
        """Say what the command took from the demo's folder, once, on stderr (stdout stays
        its output). Held until the command says something else or ends well: a refused
        command says its one error line only."""
        if self._held_note is not None:
            print(f"{PROG}: note: {self.scrub(self._held_note)}", file=self.stderr)
            self._held_note = None

    def fail(self, message: str, code: int) -> int:
        """Print `message` as the one error line, scrubbed of every token; returns `code`."""
        # A token pasted as an argument would come back in argparse's complaint
        # about it; only token-shaped text goes, so ids are shown as given.
        line = TOKEN_SHAPED.sub(REDACTED, " ".join(self.scrub(message).split()))
        print(f"{PROG}: error: {line}", file=self.stderr)
        return code

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def meta_client(self, token: str) -> MetaClient:
        """A client of the Graph the settings name; in the demo's folder with none named, of
        the demo's fake Graph."""
        # Imported here: the client pulls in httpx, which the offline commands never need.
        from rastro_assets.meta import make_client

        self.keep_secret(token)
        settings = self.settings()
        folder = self.demo_folder()
        if folder is not None:
            self._note_demo(folder)
            if folder.graph_url:
                settings = replace(settings, graph_url=folder.graph_url)
            else:
                settings = replace(settings, use_fake_graph=True)
        return make_client(settings, token)


Handler = Callable[[argparse.Namespace, Context], int]
Subparsers = argparse._SubParsersAction  # argparse exposes no public name for it
Registrar = Callable[[Subparsers], None]


class Parser(argparse.ArgumentParser):
    """Turns argparse's usage dump into one `UsageError` line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def command(subparsers: Subparsers, name: str, handler: Handler, help: str) -> Parser:
    """Add subcommand `name`, run by `handler`; returns its parser for arguments."""
    parser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler)
    return parser
