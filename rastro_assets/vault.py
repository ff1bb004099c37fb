"""Seal and open Meta access tokens with AES-256-GCM.

The key comes from `RASTRO_SECRETS_KEY` (base64 of 32 random bytes) and
nothing else: no default, no derived fallback, so a missing key fails closed.
Each ciphertext is bound to its connection id as associated data, so a sealed
token copied onto another connection does not open. No message or repr built
here ever contains a token or key material.

`read_key_file` reads a key kept in a file (the demo's `data/secrets.key`),
and only from a regular file that its owner alone may open. `derived_key` gives
another use its own key, derived from the secrets key with HKDF under a label of
that use: it tells nothing of the secrets key, nor of another label's key.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rastro_assets.settings import RASTRO_SECRETS_KEY, environment

ENV_VAR = RASTRO_SECRETS_KEY.name
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
# A key file is a line of base64 (44 characters); anything much longer is not one.
KEY_FILE_MAX_BYTES = 4096


class SecretsKeyError(Exception):
    """The secrets key is missing or malformed, or does not open a sealed token."""

    code = "SECRETS_KEY_MISSING"


class Vault:
    """Seals tokens as `nonce (12 bytes) || AES-GCM ciphertext and tag`."""

    __slots__ = ("_aead", "_var")

    def __init__(self, key: bytes, *, var: str = ENV_VAR) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            raise SecretsKeyError(
                f"{var} must be the base64 of exactly {KEY_BYTES} bytes;"
                " run `rastro keygen` for a fresh one"
            )
        self._aead = AESGCM(bytes(key))
        self._var = var

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, var: str = ENV_VAR) -> Vault:
        return cls(_key_from_env(environ, var), var=var)

    def seal(self, connection_id: str, token: str) -> bytes:
        if not connection_id:
            raise ValueError("a sealed token needs a connection id")
        if not token:
            raise ValueError("refusing to seal an empty token")
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, token.encode(), connection_id.encode())

    def open(self, connection_id: str, sealed: bytes) -> str:
        refusal = SecretsKeyError(
            f"{self._var} does not open this token (connection {connection_id!r}): wrong key"
            " or tampered ciphertext; give this process the key the token was sealed with, or"
            f" seal it again under this one: `rastro connect {connection_id}`"
        )
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            raise refusal
        nonce, ciphertext = bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:])
        try:
            plain = self._aead.decrypt(nonce, ciphertext, connection_id.encode())
        except InvalidTag:
            raise refusal from None
        return plain.decode()

    def __repr__(self) -> str:
        return f"Vault(key from {self._var})"


def _key_from_env(environ: Mapping[str, str] | None, var: str) -> bytes:
    # `var` may be one the operator names (the old key of a rotation): read as the key is.
    raw = RASTRO_SECRETS_KEY.check(environment(environ).get(var)) or ""
    if not raw:
        raise SecretsKeyError(missing_key_message(var))
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise SecretsKeyError(
            f"{var} is not valid base64: set it to the key itself, one line as `rastro keygen`"
            " prints it (a fresh key opens no token sealed before)"
        ) from None
    if len(key) != KEY_BYTES:
        raise SecretsKeyError(
            f"{var} decodes to {len(key)} bytes, not {KEY_BYTES}: set it to the key itself,"
            " one line as `rastro keygen` prints it (a fresh key opens no token sealed before)"
        )
    return key


def missing_key_message(var: str = ENV_VAR) -> str:
    """What an unset `var` stops, and which key to set: a fresh one opens no token sealed
    before, so it is the key of the warehouse's daemon unless the warehouse holds none."""
    return (
        f"{var} is not set: tokens cannot be sealed or opened without it; set it to the key"
        " this warehouse's tokens are sealed with, the one its daemon runs with (`rastro"
        " keygen` makes a fresh one, for a warehouse that holds no token yet)"
    )


def derived_key(
    label: bytes, environ: Mapping[str, str] | None = None, var: str = ENV_VAR
) -> bytes:
    """A 32-byte key of its own for the use `label` names, from the secrets key (HKDF-SHA256).
    SecretsKeyError, as `Vault.from_env`, when the secrets key is missing or malformed."""
    master = _key_from_env(environ, var)
    return HKDF(algorithm=SHA256(), length=KEY_BYTES, salt=None, info=label).derive(master)


def generate_key() -> str:
    """A fresh key for `RASTRO_SECRETS_KEY`: base64 of 32 random bytes."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The key in `path`: SecretsKeyError (one line naming the file) unless it is a regular
    file, not a symlink, owned by this user, with no group or other permission (0600).

    Another local user must be unable to read the key, or to swap in one they know: a
    symlink could point the product at their file, a file they own they could rewrite.
    """
    try:
        # O_NOFOLLOW: the file itself, never what a symlink planted at its name points to.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(path):
            raise SecretsKeyError(
                f"{path} is a symbolic link: a secrets key file must be a private regular"
                " file of yours (mode 0600); refusing it"
            ) from None
        raise SecretsKeyError(f"cannot read the secrets key file {path}: {exc.strerror}") from None
    try:
        # Checked on what was opened, not on the name, which may change meanwhile.
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretsKeyError(f"{path} is not a regular file: refusing it as a secrets key")
        if info.st_uid != os.geteuid():
            raise SecretsKeyError(
                f"{path} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()}):"
                " refusing a secrets key another user controls"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise SecretsKeyError(
                f"{path} is open to group or others (mode {mode:04o}): refusing a secrets key"
                f" others may read; `chmod 600 {path}`, and replace the key if anyone could have"
                " read it"
            )
        raw = os.read(fd, KEY_FILE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    if not text or len(raw) > KEY_FILE_MAX_BYTES:
        raise SecretsKeyError(
            f"{path} does not hold a secrets key (one line of base64); run `rastro keygen`"
            " for a fresh one"
        )
    return text
