"""The private ground a Dagster process of ours starts on, whatever the caller's umask.

`seal_process` is what `rastro daemon` and `rastro webserver` do before Dagster loads: the
process umask becomes 077 (inherited by every code server and run worker they start),
entries of DAGSTER_HOME that an earlier, looser start left open to group or others are
closed, and Python's temporary directory, in this process and through TMPDIR in every
child, becomes `DAGSTER_HOME/tmp`, a directory this user owns with mode 0700.

Why the temporary directory: a code server that the daemon or the webserver spawns
listens on a Unix socket whose path Dagster takes from `tempfile` (`GrpcServerProcess` in
dagster/_grpc/server.py, through `safe_tempfile_path_unmanaged`), `/tmp` by default. Whoever
connects to that socket can start a run, and the run's worker, as the service user, loads
the instance configuration the caller names. Inside a 0700 directory no other local user
can reach the socket, whatever mode the file itself got.

Why under DAGSTER_HOME: it is the service user's own directory already, so nobody else can
take the name first (as they could a fixed name in `/tmp`), and it exists wherever the
instance does, with no runtime directory to arrange. A temporary directory that is a
symlink, another user's, or open to others is refused rather than repaired: someone else
may have put a socket or a file in it.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rastro_assets.cli.context import UsageError
from rastro_assets.settings import DAGSTER_HOME

PROCESS_UMASK = 0o077
PRIVATE_DIR_MODE = 0o700
OPEN_TO_OTHERS = stat.S_IRWXG | stat.S_IRWXO
TEMP_DIR_NAME = "tmp"
# sun_path holds 108 bytes with its NUL; `tempfile` names a file "tmp" and 8 characters.
MAX_SOCKET_PATH = 107
TEMP_NAME_LENGTH = len("/tmpXXXXXXXX")


def dagster_home(environ: Mapping[str, str]) -> Path:
    """DAGSTER_HOME, an absolute path to an existing directory; else one `UsageError` line."""
    home = DAGSTER_HOME.read(environ) or ""
    if not home:
        raise UsageError("set DAGSTER_HOME to the Dagster instance's directory (the daemon's)")
    if not os.path.isabs(home):
        raise UsageError(f"DAGSTER_HOME must be an absolute path, not {home}")
    if not os.path.isdir(home):
        raise UsageError(f"DAGSTER_HOME {home} is not a directory")
    return Path(home)


def add_workspace_argument(parser) -> None:
    """`-w FILE`, the Dagster workspace file a command of ours starts Dagster on."""
    parser.add_argument(
        "-w",
        "--workspace",
        default="workspace.yaml",
        metavar="FILE",
        help="the Dagster workspace file (default: workspace.yaml in the working directory)",
    )


def workspace_file(given: str) -> Path:
    workspace = Path(os.path.abspath(given))
    if not workspace.is_file():
        raise UsageError(f"no workspace file at {workspace}")
    return workspace


def seal_process(home: Path) -> Path:
    """Umask 077, DAGSTER_HOME closed to others, and the private temporary directory made
    this process's and its children's; returns that directory."""
    temp = home / TEMP_DIR_NAME
    if len(os.fsencode(temp)) + TEMP_NAME_LENGTH > MAX_SOCKET_PATH:
        raise UsageError(
            f"DAGSTER_HOME {home} is too long for the code server's socket inside it:"
            f" at most {MAX_SOCKET_PATH - TEMP_NAME_LENGTH - len(TEMP_DIR_NAME) - 1} bytes"
        )
    os.umask(PROCESS_UMASK)
    # A symlinked DAGSTER_HOME is an operator's choice; what it points at is closed.
    real_home = Path(os.path.realpath(home))
    info = os.stat(real_home)
    me = os.geteuid()
    if info.st_uid != me:
        raise UsageError(
            f"DAGSTER_HOME {home} belongs to uid {info.st_uid}, not to this user (uid {me})"
        )
    # The home first: while others may write in it, they could swap the temporary
    # directory for their own between its check and its use.
    _close(real_home, info)
    private_directory(temp)
    close_tree(real_home)
    os.environ["TMPDIR"] = str(temp)
    # `tempfile` caches the directory it found first; this process's code server is
    # spawned from here (the webserver's), so the cache must name the new one too.
    tempfile.tempdir = str(temp)
    return temp


def close_tree(root: Path) -> int:
    """Take group and other permissions off `root` and everything under it that this user
    owns; returns how many entries changed.

    Each directory is closed before its entries are looked at, so nobody else can swap an
    entry for a symlink between the look and the chmod. Symlinks are never followed, and a
    directory of another user's is not entered."""
    me = os.geteuid()
    changed = 0
    pending = [root]
    while pending:
        directory = pending.pop()
        info = os.stat(directory, follow_symlinks=False)
        if info.st_uid != me or not stat.S_ISDIR(info.st_mode):
            continue
        changed += _close(directory, info)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                entry_info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(entry_info.st_mode):
                pending.append(Path(entry.path))
            elif entry_info.st_uid == me and not stat.S_ISLNK(entry_info.st_mode):
                changed += _close(Path(entry.path), entry_info)
    return changed


def _close(path: Path, info: os.stat_result) -> int:
    mode = stat.S_IMODE(info.st_mode)
    if not mode & OPEN_TO_OTHERS:
        return 0
    try:
        os.chmod(path, mode & ~OPEN_TO_OTHERS)
    except OSError:
        # A file on a read-only mount (a ConfigMap's dagster.yaml) keeps its mode: closing
        # what an earlier start left open is a second line behind the umask, not a reason to stop.
        return 0
    return 1


def private_directory(path: Path) -> Path:
    """`path` as a directory of this user's, mode 0700, not a symlink: made if missing,
    else checked; a `UsageError` line names what is wrong."""
    created = False
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror}") from None
    try:
        # O_NOFOLLOW: a symlink in its place is refused rather than followed.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise UsageError(f"{path} is a symbolic link: remove it") from None
        if exc.errno == errno.ENOTDIR:
            raise UsageError(f"{path} is not a directory: remove it") from None
        raise UsageError(f"cannot open {path}: {exc.strerror}") from None
    try:
        if created:
            # mkdir's mode went through the umask; this one does not.
            os.fchmod(fd, PRIVATE_DIR_MODE)
        info = os.fstat(fd)
    finally:
        os.close(fd)
    me = os.geteuid()
    if info.st_uid != me:
        raise UsageError(
            f"{path} belongs to uid {info.st_uid}, not to this user (uid {me}): remove it"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & OPEN_TO_OTHERS:
        raise UsageError(
            f"{path} is open to other users (mode {mode:04o}), who may have left files in it:"
            " remove it, and it is made again private"
        )
    return path
