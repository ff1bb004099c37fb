"""The webserver (CLI layer): `rastro webserver`, Dagster's UI on a socket no other user reaches.

`dagster-webserver` listens on TCP only, and any local user can open 127.0.0.1: Dagster
OSS has no login, so they could launch runs and read every run's logs. This command
serves the same app (`instance.webserver`) on a Unix socket and no TCP port at all, on the
private ground `private.seal_process` makes (umask 077, the code server's socket in
DAGSTER_HOME's 0700 `tmp`).

The socket's directory is the lock: uvicorn's sockets, and this one, are mode 0666,
so whoever can enter the directory can connect. The directory must belong to this
user, give the "other" class nothing (0750: the owner, and the reverse proxy through
the directory's group), and not be a symlink; a missing one is created 0750. A socket
left by a killed server is replaced; a socket that still answers, or any other file
at the path, is refused. Every check is made on the directory the command holds open,
and the socket is bound inside that same directory, so nothing swapped in between a
check and the bind is used; `ss -xl` therefore shows the socket bound as
/proc/self/fd/N/NAME.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rastro_assets.cli.context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    Registrar,
    Subparsers,
    UsageError,
    command,
)
from rastro_assets.cli.private import (
    add_workspace_argument,
    dagster_home,
    seal_process,
    workspace_file,
)

SOCKET_DIR_MODE = 0o750
SOCKET_MODE = 0o666
# sun_path holds 108 bytes with its terminating NUL.
MAX_SOCKET_PATH = 107
STALE_CHECK_SECONDS = 2.0
LISTEN_BACKLOG = 2048  # uvicorn's default


def add_webserver(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "webserver",
        _serve,
        "serve the Dagster UI on a Unix socket only (for a reverse proxy), never on a TCP port",
    )
    parser.add_argument(
        "--socket",
        required=True,
        metavar="PATH",
        help="the socket to create, in a directory of this user's that others cannot enter",
    )
    add_workspace_argument(parser)
    parser.add_argument(
        "--path-prefix",
        default="",
        metavar="P",
        help="the path the proxy serves the UI under, e.g. /dagster (default: the root)",
    )


@dataclass
class Listener:
    """A listening Unix socket and the open directory it was bound in."""

    sock: socket.socket
    path: Path
    dir_fd: int
    inode: int

    def close(self) -> None:
        """Close the socket and remove its file, unless another server has replaced it."""
        self.sock.close()
        name = self.path.name
        with contextlib.suppress(OSError):
            if os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_ino == self.inode:
                os.unlink(name, dir_fd=self.dir_fd)
        os.close(self.dir_fd)


def _serve(args: argparse.Namespace, ctx: Context) -> int:
    home = dagster_home(ctx.environ)
    workspace = workspace_file(args.workspace)
    prefix = args.path_prefix
    if prefix and (not prefix.startswith("/") or prefix.endswith("/")):
        raise UsageError(f"--path-prefix must start with / and not end with one, not {prefix}")

    try:
        with bound_socket(args.socket) as listener:
            # After the bind, whose modes are set explicitly, and before Dagster creates
            # anything or spawns the code server.
            seal_process(home)
            # A SIGTERM (systemd's stop) while Dagster loads, or the one uvicorn raises again
            # after its graceful shutdown, must unwind as an interrupt: the workspace stops its
            # code server and the socket file goes, which the default handler's exit would skip.
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            # Imported here: it loads Dagster, which no other command needs.
            from rastro_assets.instance.webserver import serve_ui

            started = serve_ui(listener.sock, workspace, prefix, str(listener.path))
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK if started else EXIT_FAILED


@contextlib.contextmanager
def bound_socket(given: str) -> Iterator[Listener]:
    """Listen on the Unix socket `given` once its directory passes the checks above; the
    socket file is removed on the way out."""
    listener = bind_socket(given)
    try:
        yield listener
    finally:
        listener.close()


def bind_socket(given: str) -> Listener:
    """The checks, then the bind; every refusal is a `UsageError` naming absolute paths."""
    if given.endswith("/"):
        raise UsageError(f"--socket names the socket file, not a directory: {given}")
    # Not resolved: resolving would follow the very symlink the checks look for.
    path = Path(os.path.abspath(given))
    if path.name in ("", ".", ".."):
        raise UsageError(f"--socket names the socket file, not a directory: {path}")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UsageError(
            f"{path} is longer than a Unix socket path may be ({MAX_SOCKET_PATH} bytes)"
        )
    dir_fd = _open_socket_dir(path.parent)
    try:
        return _bind_in(dir_fd, path)
    except BaseException:
        os.close(dir_fd)
        raise


def _open_socket_dir(parent: Path) -> int:
    created = False
    try:
        os.mkdir(parent, 0o700)
        created = True
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise UsageError(f"cannot create {parent}: {parent.parent} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot create {parent}: {exc.strerror}") from None
    try:
        # O_NOFOLLOW: a symlink in the last place is refused rather than followed.
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if os.path.islink(parent):
            raise UsageError(
                f"{parent} is a symbolic link: put the socket in a real directory"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise UsageError(f"{parent} is not a directory") from None
        raise UsageError(f"cannot open {parent}: {exc.strerror}") from None
    try:
        if created:
            # mkdir's mode went through the umask; this one does not.
            os.fchmod(dir_fd, SOCKET_DIR_MODE)
        _check_socket_dir(parent, os.fstat(dir_fd))
    except BaseException:
        os.close(dir_fd)
        raise
    return dir_fd


def _check_socket_dir(parent: Path, info: os.stat_result) -> None:
    me = os.geteuid()
    if info.st_uid != me:
        raise UsageError(
            f"{parent} belongs to uid {info.st_uid}, not to this user (uid {me}): the"
            " socket's directory must be this user's"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IRWXO:
        raise UsageError(
            f"{parent} is open to other users (mode {mode:04o}): give others nothing,"
            f" e.g. chmod 0750 {parent}"
        )


def _bind_in(dir_fd: int, path: Path) -> Listener:
    name = path.name
    # The directory as held open, not as named now: a rename since the checks changes nothing.
    held = f"/proc/self/fd/{dir_fd}/{name}"
    if not os.path.isdir(f"/proc/self/fd/{dir_fd}"):
        raise UsageError(f"cannot bind {path} safely: /proc is not mounted")
    try:
        existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        existing = None
    if existing is not None:
        if not stat.S_ISSOCK(existing.st_mode):
            raise UsageError(f"{path} exists and is not a socket: remove it or choose another")
        if _answers(held):
            raise UsageError(f"{path}: a server already listens on this socket")
        os.unlink(name, dir_fd=dir_fd)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The file's mode comes from the umask at bind time (the service's is 0077); the
    # directory, not the file, keeps other users out, and the proxy needs write on it.
    # Set for the bind alone, before any other thread exists.
    old_umask = os.umask(0o777 & ~SOCKET_MODE)
    try:
        sock.bind(held)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {path}: {exc.strerror}") from None
    finally:
        os.umask(old_umask)
    # Listening at once: a second server started meanwhile finds this socket answering,
    # not stale; a proxy's early requests wait in the backlog until the UI is up.
    sock.listen(LISTEN_BACKLOG)
    inode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino
    return Listener(sock=sock, path=path, dir_fd=dir_fd, inode=inode)


def _answers(held: str) -> bool:
    """Whether a server listens on the socket; a socket left by a killed one refuses."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(STALE_CHECK_SECONDS)
    try:
        probe.connect(held)
    except ConnectionRefusedError:
        return False
    except OSError:
        # Neither refused nor accepted (a full backlog, a timeout): someone may be there.
        return True
    finally:
        probe.close()
    return True


REGISTRARS: list[Registrar] = [add_webserver]
