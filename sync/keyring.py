"""Key files and the key ring: the keys a device encrypts with.

This module owns reading key files (and refusing ones others can read), writing new
ones and rotating them (a new first key), finding the key file (configured, or the
systemd credential), and each entry's *master* key for a bucket (HKDF of a key, or
scrypt of a passphrase, with the bucket's salt). What is sealed with the masters,
and the bucket's key objects, are :mod:`sync.crypto`'s (its docstring has the
scheme).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from ledgerd.sync.errors import KeyFileError

KEY_LEN = 32
KID_LEN = 4
CREDENTIAL = "ledgerd-key"
"""The systemd credential a key file is read from (``$CREDENTIALS_DIRECTORY/ledgerd-key``)."""
VERSION = b"ledgerd-crypt-1"
"""In every key derivation and every sealed part's associated data."""


@dataclass(frozen=True)
class Secret:
    """One entry of a key file: a random key or a passphrase (never logged: no repr)."""

    kind: str  # "key" or "passphrase"
    value: bytes = field(repr=False)


@dataclass
class KeyRing:
    """A key file's entries, in order (the first writes), and where they came from."""

    secrets: list[Secret]
    source: str
    _masters: dict[tuple[bytes, int, int, int], list[tuple[bytes, bytes]]] = field(
        default_factory=dict, repr=False
    )

    def masters(self, salt: bytes, n: int, r: int, p: int) -> list[tuple[bytes, bytes]]:
        """``(key id, master key)`` per entry for a bucket (scrypt runs once per bucket)."""
        at = (salt, n, r, p)
        if at not in self._masters:
            out = []
            for s in self.secrets:
                if s.kind == "key":
                    master = hkdf(s.value, b"master", salt)
                else:
                    master = Scrypt(salt=salt, length=KEY_LEN, n=n, r=r, p=p).derive(s.value)
                out.append((hkdf(master, b"key id")[:KID_LEN], master))
            self._masters[at] = out
        return self._masters[at]


def new_key() -> bytes:
    return secrets.token_bytes(KEY_LEN)


def key_line(key: bytes) -> str:
    return f"key {base64.b64encode(key).decode()}\n"


def parse_key_file(text: str, source: str) -> KeyRing:
    """The entries of a key file's text; KeyFileError (naming the line, never its content)."""
    out: list[Secret] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kind, _, value = line.partition(" ")
        value = value.strip()
        if kind == "key":
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != KEY_LEN:
                raise KeyFileError(f"{source}, line {n}: a key is base64 of {KEY_LEN} bytes")
            out.append(Secret("key", raw))
        elif kind == "passphrase":
            if len(value) < 8:
                raise KeyFileError(f"{source}, line {n}: a passphrase has at least 8 characters")
            out.append(Secret("passphrase", value.encode()))
        else:
            raise KeyFileError(f"{source}, line {n}: expected 'key BASE64' or 'passphrase TEXT'")
    if not out:
        raise KeyFileError(f"{source}: holds no key")
    return KeyRing(out, source)


def load_key_file(path: Path) -> KeyRing:
    """A key file's keys; KeyFileError if it is missing, unreadable, malformed, or
    readable or writable by group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise KeyFileError(f"key file {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"key file {path}: not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"key file {path}: group or others may access it (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); run chmod 600 {path}"
            )
        data = f.read(64 * 1024)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise KeyFileError(f"key file {path}: not UTF-8 text") from None
    return parse_key_file(text, f"key file {path}")


def write_key_file(path: Path, prepend_to: bytes | None = None, text: str | None = None) -> bytes:
    """Write a new random key (or the entry ``text``) to ``path``, mode 0600; refuses
    to overwrite. With ``prepend_to`` (an existing file's content) the new key goes
    first. Returns the new key."""
    key = new_key()
    head = "# ledgerd encryption keys: the first one writes, every one reads. Keep it secret.\n"
    text = head + (text if text is not None else key_line(key))
    if prepend_to is not None:
        old = prepend_to.decode()
        text += "".join(
            line + "\n" for line in old.splitlines() if not line.startswith("# ledgerd")
        )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return key


def add_key(path: Path) -> None:
    """Rotation's first step: a new random key at the top of ``path`` (the old ones
    stay, for reading). Written next to it and renamed over it, mode 0600."""
    load_key_file(path)  # it is a good key file
    old = path.read_bytes()
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        write_key_file(tmp, prepend_to=old)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def find_key_file(configured: Path | None, env: dict[str, str]) -> Path | None:
    """The key file to use: ``encryption_key_file`` (or ``LEDGERD_ENCRYPTION_KEY_FILE``,
    already in ``configured``), else the systemd credential ``ledgerd-key``."""
    if configured is not None:
        return configured
    creds = env.get("CREDENTIALS_DIRECTORY")
    if creds and (Path(creds) / CREDENTIAL).exists():
        return Path(creds) / CREDENTIAL
    return None


def hkdf(ikm: bytes, purpose: bytes, salt: bytes | None = None) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_LEN, salt=salt, info=VERSION + b" " + purpose
    ).derive(ikm)
