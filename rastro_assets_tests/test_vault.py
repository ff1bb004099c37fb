"""The vault: AES-256-GCM bound to the connection id, failing closed and saying why."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from rastro_assets.vault import (
    ENV_VAR,
    NONCE_BYTES,
    SecretsKeyError,
    Vault,
    derived_key,
    generate_key,
    read_key_file,
)

TOKEN = "EAAGm0PX4ZCpsBAKZAZBZCSuperSecretToken123"


def make_vault(key: str | None = None) -> Vault:
    return Vault.from_env({ENV_VAR: key or generate_key()})


def test_round_trip():
    vault = make_vault()
    assert vault.open("c1", vault.seal("c1", TOKEN)) == TOKEN


def test_round_trip_through_the_process_environment(vault: Vault, secrets_key: str):
    sealed = vault.seal("c1", TOKEN)
    assert Vault.from_env().open("c1", sealed) == TOKEN


def test_each_seal_has_a_fresh_nonce():
    vault = make_vault()
    first, second = vault.seal("c1", TOKEN), vault.seal("c1", TOKEN)
    assert first != second
    assert first[:NONCE_BYTES] != second[:NONCE_BYTES]
    assert vault.open("c1", first) == vault.open("c1", second) == TOKEN


def test_ciphertext_does_not_contain_the_token():
    sealed = make_vault().seal("c1", TOKEN)
    assert TOKEN.encode() not in sealed
    assert len(sealed) == NONCE_BYTES + len(TOKEN) + 16


def test_wrong_key_is_refused():
    sealed = make_vault().seal("c1", TOKEN)
    with pytest.raises(SecretsKeyError) as refused:
        make_vault().open("c1", sealed)
    assert ENV_VAR in str(refused.value)
    assert "wrong key or tampered ciphertext" in str(refused.value)


@pytest.mark.parametrize("position", [0, NONCE_BYTES - 1, NONCE_BYTES, -17, -1])
def test_tampered_ciphertext_is_refused(position: int):
    vault = make_vault()
    sealed = bytearray(vault.seal("c1", TOKEN))
    sealed[position] ^= 0x01
    with pytest.raises(SecretsKeyError, match="wrong key or tampered"):
        vault.open("c1", bytes(sealed))


@pytest.mark.parametrize("sealed", [b"", b"\0" * 12, b"\0" * 27])
def test_truncated_ciphertext_is_refused(sealed: bytes):
    with pytest.raises(SecretsKeyError, match="wrong key or tampered"):
        make_vault().open("c1", sealed)


def test_ciphertext_moved_to_another_connection_is_refused():
    vault = make_vault()
    sealed = vault.seal("c1", TOKEN)
    with pytest.raises(SecretsKeyError, match="connection 'c2'"):
        vault.open("c2", sealed)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "is not set"),
        ({ENV_VAR: ""}, "is not set"),
        ({ENV_VAR: "   "}, "is not set"),
        ({ENV_VAR: "not base64 at all!"}, "is not valid base64"),
        ({ENV_VAR: base64.b64encode(b"k" * 16).decode()}, "decodes to 16 bytes, not 32"),
        ({ENV_VAR: base64.b64encode(b"k" * 33).decode()}, "decodes to 33 bytes, not 32"),
        ({ENV_VAR: base64.urlsafe_b64encode(b"\xff" * 32).decode()}, "is not valid base64"),
    ],
)
def test_bad_keys_name_the_variable(environ: dict[str, str], expected: str):
    with pytest.raises(SecretsKeyError) as refused:
        Vault.from_env(environ)
    message = str(refused.value)
    assert message.startswith(ENV_VAR)
    assert expected in message
    assert "rastro keygen" in message
    for value in environ.values():
        if value.strip():
            assert value not in message


def test_missing_key_in_the_process_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(SecretsKeyError, match=f"^{ENV_VAR} is not set"):
        Vault.from_env()


def test_another_variable_name_is_named_in_errors():
    with pytest.raises(SecretsKeyError, match="^OLD_KEY is not set"):
        Vault.from_env({ENV_VAR: generate_key()}, var="OLD_KEY")
    vault = Vault.from_env({"OLD_KEY": generate_key()}, var="OLD_KEY")
    with pytest.raises(SecretsKeyError, match="^OLD_KEY does not open"):
        vault.open("c1", make_vault().seal("c1", TOKEN))


@pytest.mark.parametrize("key", [b"", b"k" * 31, b"k" * 64, "k" * 32])
def test_constructor_wants_exactly_32_bytes(key):
    with pytest.raises(SecretsKeyError, match="32 bytes"):
        Vault(key)


def test_no_key_material_or_token_in_repr_or_messages():
    key = generate_key()
    vault = make_vault(key)
    raw = base64.b64decode(key)
    assert key not in repr(vault)
    assert repr(raw) not in repr(vault)
    assert ENV_VAR in repr(vault)
    sealed = vault.seal("c1", TOKEN)
    messages = []
    for attempt in (
        lambda: make_vault().open("c1", sealed),
        lambda: vault.open("c2", sealed),
        lambda: vault.open("c1", sealed[:-1] + bytes([sealed[-1] ^ 1])),
    ):
        with pytest.raises(SecretsKeyError) as refused:
            attempt()
        messages.append(f"{refused.value} {refused.value!r}")
    for message in messages:
        assert TOKEN not in message
        assert key not in message


def test_empty_token_and_connection_are_not_sealed():
    vault = make_vault()
    with pytest.raises(ValueError, match="empty token"):
        vault.seal("c1", "")
    with pytest.raises(ValueError, match="connection id"):
        vault.seal("", TOKEN)


def test_generate_key_is_32_random_bytes():
    keys = {generate_key() for _ in range(20)}
    assert len(keys) == 20
    for key in keys:
        assert len(base64.b64decode(key, validate=True)) == 32
        make_vault(key)


# A key kept in a file ---------------------------------------------------------


def key_file(tmp_path: Path, mode: int = 0o600, text: str | None = None) -> Path:
    path = tmp_path / "secrets.key"
    path.write_text(generate_key() + "\n" if text is None else text)
    path.chmod(mode)
    return path


def test_a_private_key_file_of_ones_own_is_read(tmp_path: Path):
    path = key_file(tmp_path)
    key = read_key_file(path)
    assert key == path.read_text().strip()
    make_vault(key)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620, 0o602, 0o660])
def test_a_key_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int):
    path = key_file(tmp_path, mode)
    with pytest.raises(SecretsKeyError) as refused:
        read_key_file(path)
    message = str(refused.value)
    assert message.startswith(f"{path} is open to group or others (mode {mode:04o})")
    assert f"chmod 600 {path}" in message
    assert path.read_text().strip() not in message
    assert "\n" not in message


def test_a_symlink_is_refused_even_to_a_private_key_file(tmp_path: Path):
    target = key_file(tmp_path)
    link = tmp_path / "link.key"
    link.symlink_to(target)
    with pytest.raises(SecretsKeyError, match=f"^{link} is a symbolic link"):
        read_key_file(link)
    dangling = tmp_path / "dangling.key"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(SecretsKeyError, match="is a symbolic link"):
        read_key_file(dangling)


def test_what_is_no_regular_file_is_refused(tmp_path: Path):
    directory = tmp_path / "secrets.key"
    directory.mkdir(mode=0o700)
    with pytest.raises(SecretsKeyError, match="is not a regular file"):
        read_key_file(directory)
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SecretsKeyError, match="is not a regular file"):
        read_key_file(fifo)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")
def test_a_key_file_another_user_owns_is_refused(tmp_path: Path):
    path = key_file(tmp_path)
    os.chown(path, 4321, -1)
    with pytest.raises(SecretsKeyError, match=r"owned by uid 4321, not by you"):
        read_key_file(path)


@pytest.mark.parametrize("text", ["", "\n", "\xff\xfe", "k" * 5000])
def test_a_file_holding_no_key_is_refused(tmp_path: Path, text: str):
    path = tmp_path / "secrets.key"
    path.write_bytes(text.encode("latin-1"))
    path.chmod(0o600)
    with pytest.raises(SecretsKeyError, match="does not hold a secrets key"):
        read_key_file(path)


def test_a_missing_key_file_says_so(tmp_path: Path):
    with pytest.raises(SecretsKeyError, match="cannot read the secrets key file .*: No such file"):
        read_key_file(tmp_path / "absent.key")


def test_a_derived_key_is_its_labels_own_and_tells_nothing_of_the_secrets_key():
    key = generate_key()
    env = {ENV_VAR: key}
    first = derived_key(b"one use", env)
    assert len(first) == 32 and first == derived_key(b"one use", env)
    assert first != derived_key(b"another use", env)
    assert first != base64.b64decode(key)
    assert first != derived_key(b"one use", {ENV_VAR: generate_key()})
    with pytest.raises(SecretsKeyError, match=f"{ENV_VAR} is not set"):
        derived_key(b"one use", {})
