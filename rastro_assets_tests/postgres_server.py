"""A real PostgreSQL server for one test: initdb into a temporary directory, start it on a free
loopback port with TLS, create a database, and always stop it and delete its files.

PostgreSQL refuses to run as root, and CI runs as root: then every PostgreSQL process runs as
the unprivileged `nobody` (Python's `subprocess` drops to it; no sudo, su or runuser needed),
and its directory lives under the system temp dir rather than pytest's root-only one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from glob import glob
from pathlib import Path

import psycopg2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from psycopg2 import sql

from rastro_assets.warehouse import schema

UNPRIVILEGED_USER = "nobody"
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 30
# A test server holds nothing worth a crash-safe disk write; these make it several times faster.
TEST_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "ssl": "on",
    "ssl_cert_file": "'server.crt'",
    "ssl_key_file": "'server.key'",
}


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str
    password: str
    db: str
    log: Path

    def env(self) -> dict[str, str]:
        """The `DAGSTER_PG_*` variables `docs/dagster.scaled.yaml` reads."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.db,
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def connect(self):
        return psycopg2.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=self.db,
            sslmode="require",
        )


def postgres_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"PostgreSQL's `{name}` is not installed (needs PostgreSQL 15+)")
    return found


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_self_signed_certificate(data_dir: Path) -> None:
    """A throwaway certificate, so the config's `sslmode: require` holds as written."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    (data_dir / "server.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path = data_dir / "server.key"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)


class Cluster:
    """One data directory and the processes run on it, as the server's own user."""

    def __init__(self, root: Path) -> None:
        self.root, self.data = root, root / "data"
        self.log = root / "postgres.log"
        account = pwd.getpwnam(UNPRIVILEGED_USER) if os.geteuid() == 0 else None
        self.user_ids = (account.pw_uid, account.pw_gid) if account else None

    def hand_over(self, path: Path) -> None:
        if self.user_ids is not None:
            os.chown(path, *self.user_ids)

    def run(self, *args: str, timeout: float) -> None:
        drop = {}
        if self.user_ids is not None:
            drop = {"user": self.user_ids[0], "group": self.user_ids[1], "extra_groups": []}
        result = subprocess.run(
            args,
            cwd=self.root,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "TZ": "UTC"},
            capture_output=True,
            text=True,
            timeout=timeout,
            **drop,
        )
        if result.returncode != 0:
            server_log = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{Path(args[0]).name} failed:\n{result.stdout}{result.stderr}{server_log}"
            )

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        return None

    def stop(self) -> None:
        """A fast shutdown; if that fails, an immediate one, then SIGKILL: nothing stays up."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.run(
                postgres_bin("pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w",
                "-t", str(STOP_TIMEOUT_SECONDS), timeout=STOP_TIMEOUT_SECONDS + 5,
            )
            return
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)


@contextlib.contextmanager
def postgres_server(db: str = "dagster") -> Iterator[PostgresServer]:
    """A running PostgreSQL server with an empty database `db`; stopped and deleted on exit."""
    root = Path(tempfile.mkdtemp(prefix="rastro-postgres-"))
    cluster = Cluster(root)
    try:
        cluster.hand_over(root)
        user, password = "rastro", secrets.token_urlsafe(18)
        password_file = root / "password"
        password_file.write_text(password)
        password_file.chmod(0o600)
        cluster.hand_over(password_file)
        cluster.run(
            postgres_bin("initdb"), "-D", str(cluster.data), "-U", user,
            f"--pwfile={password_file}", "--auth=scram-sha-256", "--encoding=UTF8",
            "--locale=C", "--no-sync", timeout=120,
        )
        password_file.unlink()
        write_self_signed_certificate(cluster.data)
        cluster.hand_over(cluster.data / "server.crt")
        cluster.hand_over(cluster.data / "server.key")
        port = free_loopback_port()
        settings = {**TEST_SETTINGS, "port": str(port)}
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        cluster.run(
            postgres_bin("pg_ctl"), "start", "-D", str(cluster.data), "-l", str(cluster.log),
            "-w", "-t", str(START_TIMEOUT_SECONDS), timeout=START_TIMEOUT_SECONDS + 5,
        )
        admin = PostgresServer("127.0.0.1", port, user, password, "postgres", cluster.log)
        with contextlib.closing(admin.connect()) as con:
            con.autocommit = True
            with con.cursor() as cursor:
                cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        yield PostgresServer("127.0.0.1", port, user, password, db, cluster.log)
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


class _MigrationRecorder:
    """Stands in for an empty PostgreSQL warehouse while `schema.migrate` runs on it: keeps
    each statement that changes the schema, and answers that none was applied yet."""

    engine = "postgres"

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple]] = []

    def execute(self, statement: str, params=()) -> _MigrationRecorder:
        text = statement.strip()
        if not text.upper().startswith(("SELECT", "BEGIN", "COMMIT", "ROLLBACK")):
            self.statements.append((text, tuple(params or ())))
        return self

    def fetchone(self) -> tuple:
        return (0,)


def migration_script(cursor) -> str:
    """Every statement `schema.migrate` runs on an empty PostgreSQL schema, as one text that
    makes the whole schema in one round trip; `cursor` quotes the parameters."""
    recorder = _MigrationRecorder()
    schema.migrate(recorder)
    return ";\n".join(
        cursor.mogrify(text.replace("?", "%s"), params).decode() if params else text
        for text, params in recorder.statements
    )


class WarehouseServer:
    """A server the warehouse's tests share: each asks for a schema of its own, by URL."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self._admin = None
        self._migration_script: str | None = None

    def url(self, **query: str) -> str:
        s = self.server
        params = "&".join(f"{k}={v}" for k, v in {"sslmode": "require", **query}.items())
        return f"postgresql://{s.user}:{s.password}@{s.host}:{s.port}/{s.db}?{params}"

    def fresh_schema_url(self) -> str:
        """The URL of a new, empty schema, found through the connection's search path."""
        return self._new_schema(migrated=False)

    def migrated_schema_url(self) -> str:
        """The URL of a new schema as `schema.migrate` leaves an empty one: its statements
        run as one text, which costs a fraction of migrating statement by statement."""
        return self._new_schema(migrated=True)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def _new_schema(self, migrated: bool) -> str:
        name = "t_" + secrets.token_hex(6)
        for attempt in range(2):
            try:
                self._create_schema(name, migrated)
                break
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                # A test may have had the server drop every connection, the kept one too.
                self.close()
                if attempt:
                    raise
        return self.url(options=f"-csearch_path%3D{name}")

    def _create_schema(self, name: str, migrated: bool) -> None:
        if self._admin is None or self._admin.closed:
            self._admin = self.server.connect()
        with self._admin, self._admin.cursor() as cursor:
            statements = [sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name))]
            if migrated:
                if self._migration_script is None:
                    self._migration_script = migration_script(cursor)
                statements += [
                    sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(name)),
                    sql.SQL(self._migration_script),
                ]
            cursor.execute(sql.SQL(";\n").join(statements))
