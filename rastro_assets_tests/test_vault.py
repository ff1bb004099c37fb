"""The vault: AES-256-GCM bound to the connection id, failing closed and saying why."""

from __future__ import annotations

import base64

import pytest

from rastro_assets.vault import ENV_VAR, NONCE_BYTES, SecretsKeyError, Vault, generate_key

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
