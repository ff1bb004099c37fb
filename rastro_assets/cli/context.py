"""What every `rastro` command stands on: `Context`, `command()`, `UsageError`, exit codes.

Each subcommand is a `Registrar` (adds its parser) plus a `Handler` (does the
work with a `Context`). This module imports no command, so every command
module imports it and `rastro_assets.cli` imports them all, with no cycle.

Bad input of any kind, argparse's included, ends as exactly one line on
stderr, `rastro: error: ...`, and exit code 2, before anything is written.
No token ever reaches stdout, stderr or argv: tokens come from stdin or a
named environment variable, and every error line is scrubbed of them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NoReturn, TextIO

from rastro_assets.process_settings import Settings
from rastro_assets.timekeeping import Clock, system_clock
from rastro_assets.tokens import TOKEN_SHAPED
from rastro_assets.vault import Vault
from rastro_assets.warehouse.engines import AnyWarehouse, open_warehouse

if TYPE_CHECKING:
    from rastro_assets.meta.client import MetaClient

PROG = "rastro"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

REDACTED = "[redacted]"


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


@dataclass
class Context:
    """What a handler may touch: the environment, the streams and the clock."""

    environ: Mapping[str, str]
    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    clock: Clock = system_clock
    secrets: list[str] = field(default_factory=list, repr=False)

    @classmethod
    def from_process(cls) -> Context:
        return cls(environ=os.environ, stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr)

    def settings(self) -> Settings:
        return Settings.from_env(dict(self.environ))

    def warehouse(self) -> AnyWarehouse:
        """The database of RASTRO_WAREHOUSE_URL; else the pipeline's file, named by
        RASTRO_DUCKDB_PATH or found from the working directory upward; one error line
        naming the path tried when neither."""
        return open_warehouse(self.settings(), require_path=True)

    def vault(self) -> Vault:
        return Vault.from_env(self.environ)

    def now(self) -> datetime:
        return self.clock()

    def keep_secret(self, secret: str) -> None:
        """Scrub `secret` from every line this command prints from now on."""
        if secret:
            self.secrets.append(secret)

    def say(self, line: str) -> None:
        print(self.scrub(line), file=self.stdout)

    def warn(self, line: str) -> None:
        print(f"{PROG}: warning: {self.scrub(line)}", file=self.stderr)

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
        # Imported here: the client pulls in httpx, which the offline commands never need.
        from rastro_assets.meta import make_client

        self.keep_secret(token)
        return make_client(self.settings(), token)


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
