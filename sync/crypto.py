"""Client-side encryption: the per-part codec, and the bucket's key objects.

This module owns what makes a bucket unreadable without the key: deriving keys,
sealing and opening one *part* of an object (:meth:`Codec.seal`,
:meth:`Codec.open`), keyed names, and the bucket's encryption descriptor and key
objects. It does not know the pack format (:mod:`sync.pack` calls the codec once
per part) nor when sync writes what (:mod:`sync.engine`). Key files and each key's
master are :mod:`sync.keyring`'s; the errors are :mod:`sync.errors`'s (all
importable from here).

Keys. A key file holds one entry a line, ``key <base64 of 32 random bytes>`` or
``passphrase <text>``; ``#`` starts a comment. The first entry writes, every
entry reads (rotation). Per bucket, each entry yields a *master* key: HKDF-SHA256
of the key with the bucket's random salt, or scrypt of the passphrase with that
salt and the cost stored in the bucket. From a master, HKDF derives a 4-byte key
id (stored in front of every sealed part) and one AES-256-GCM key per purpose
(``header``, ``eager``, ``lazy``, ``secret``...).

A sealed part is ``key id (4) | nonce (12) | AES-256-GCM(u32 length | plain | zero
padding)``: the plain text (already compressed) is padded to a size bucket (at
least :data:`MIN_PADDED` bytes, then Padmé: at most 12% more) so that the length
of a small value tells nothing. The associated data is the part's
:class:`Context` (the object's identity, its role, and an item: an index or a
digest) and the key id, so a part moved to another place, another object or
another name fails authentication.

The bucket. ``ledgerd-bucket.crypt`` (written once, just after the marker, by the
first device, which has a key, into a bucket that holds nothing else) holds the
salt, the scrypt cost, the creator's key id and the *bucket secret* sealed under
the creator's key. The secret keys the names (a device's keyed tag in pack names,
:meth:`Codec.device_tag`) and keyed digests; it stays the same when keys rotate,
so names do too. Each later write key is registered as
``ledgerd-bucket.key.{key id}``: the secret sealed under it, written by a device
that could already open the secret with an older key. A key that opens neither is
the wrong key; a part sealed under a key id that is neither the descriptor's nor a
registered one was not written for this bucket. When sync may write the
descriptor, and what each device remembers of it, is :mod:`sync.context`'s.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.errors import (
    AlreadyExistsError,
    BucketIdentityError,
    BucketNotEncryptedError,
    EncryptionError,
    EncryptionKeyMismatchError,
    EncryptionKeyMissingError,
    KeyFileError,
    KeyNotHereError,
    KeyNotRegisteredError,
    TamperedError,
)
from ledgerd.sync.keyring import (
    CREDENTIAL,
    KEY_LEN,
    KID_LEN,
    VERSION,
    KeyRing,
    Secret,
    add_key,
    find_key_file,
    hkdf,
    key_line,
    load_key_file,
    new_key,
    parse_key_file,
    write_key_file,
)

log = logging.getLogger(__name__)

__all__ = [  # with the key ring's and the errors' names, as callers import them from here
    "CREDENTIAL",
    "DESCRIPTOR",
    "KEY_LEN",
    "KEY_OBJECT",
    "KID_LEN",
    "MIN_PADDED",
    "NONCE_LEN",
    "OVERHEAD",
    "SALT_LEN",
    "SCRYPT_MOST_MEMORY",
    "SCRYPT_N",
    "SCRYPT_P",
    "SCRYPT_R",
    "TAG_LEN",
    "BucketNotEncryptedError",
    "Codec",
    "Context",
    "Descriptor",
    "EncryptionError",
    "EncryptionKeyMismatchError",
    "EncryptionKeyMissingError",
    "KeyFileError",
    "KeyNotHereError",
    "KeyNotRegisteredError",
    "KeyRing",
    "Secret",
    "TamperedError",
    "add_key",
    "create_descriptor",
    "find_key_file",
    "is_crypto_object",
    "key_line",
    "key_object_id",
    "load_key_file",
    "new_key",
    "open_bucket",
    "padded",
    "parse_descriptor",
    "parse_key_file",
    "sealed_size",
    "write_key_file",
]

NONCE_LEN = 12
TAG_LEN = 16
OVERHEAD = KID_LEN + NONCE_LEN + TAG_LEN
"""Bytes a sealed part has on top of its padded plain text."""
_LEN = struct.Struct(">I")
MIN_PADDED = 256
"""Every sealed part's plain text (with its length) is padded to at least this."""
SALT_LEN = 16
SCRYPT_N = 1 << 17
"""scrypt cost of a new bucket (128 MiB with r=8): a passphrase derivation takes
about half a second, once per bucket check."""
SCRYPT_R = 8
SCRYPT_P = 1
SCRYPT_MOST_MEMORY = 1 << 30
"""The largest scrypt cost (128·n·r·p bytes) a bucket may ask for."""
DESCRIPTOR = "ledgerd-bucket.crypt"
KEY_OBJECT = "ledgerd-bucket.key."


# -- the codec ---------------------------------------------------------------------


def padded(n: int) -> int:
    """The size ``n`` bytes of plain text (with its length) are padded to: at least
    MIN_PADDED, then Padmé (the low bits of ``n`` cleared: at most 12% more)."""
    if n <= MIN_PADDED:
        return MIN_PADDED
    e = n.bit_length() - 1
    s = e.bit_length()
    mask = (1 << (e - s)) - 1
    return (n + mask) & ~mask


def sealed_size(n: int) -> int:
    """The size of ``n`` bytes of plain text once sealed."""
    return padded(_LEN.size + n) + OVERHEAD


@dataclass(frozen=True)
class Context:
    """Where a part belongs: the object's identity (a pack's name without its ends),
    the part's role, and an item (a section's index, a piece's digest). It is the
    associated data of the part's seal; nothing of it is stored."""

    object: str
    role: str
    item: bytes = b""

    def ad(self, kid: bytes) -> bytes:
        obj, role = self.object.encode(), self.role.encode()
        return b"".join(
            [VERSION, kid, _LEN.pack(len(obj)), obj, _LEN.pack(len(role)), role, self.item]
        )


class Codec:
    """Seals and opens parts, and keys names, for one bucket (its secret and salt).

    ``masters`` are ``(key id, master)`` in key-file order: the first seals, every
    one opens. ``registered``: the key ids the bucket registered (its descriptor's
    and its key objects'); a part sealed under another id that this device does not
    have either is :class:`KeyNotRegisteredError`, not :class:`KeyNotHereError`
    (None: every id counts as registered). Thread-safe (packs are sealed off the
    event loop)."""

    def __init__(
        self,
        masters: list[tuple[bytes, bytes]],
        secret: bytes,
        registered: Iterable[bytes] | None = None,
    ) -> None:
        if not masters:
            raise ValueError("no keys")
        self.write_kid = masters[0][0]
        self._masters = dict(masters)
        self._registered = None if registered is None else frozenset(registered)
        self._unregistered: set[bytes] = set()
        """Key ids met that neither this device nor the bucket's registry (as last
        read) knows: the registry is read again before such a part is refused for good
        (see :meth:`sync.context.SyncContext.keys_registered_since`)."""
        self._aeads: dict[tuple[bytes, str], AESGCM] = {}
        self._names = hkdf(secret, b"names")
        self._digests = hkdf(secret, b"digests")

    @property
    def key_ids(self) -> list[str]:
        return [k.hex() for k in self._masters]

    def register(self, kids: Iterable[bytes]) -> None:
        """Key ids the bucket registered since this codec was made (read again)."""
        if self._registered is not None:
            self._registered = self._registered | frozenset(kids)

    def take_unregistered(self) -> set[bytes]:
        """The unregistered key ids met since the last call (and forget them)."""
        out, self._unregistered = self._unregistered, set()
        return out

    def _aead(self, kid: bytes, role: str) -> AESGCM:
        aead = self._aeads.get((kid, role))
        if aead is None:
            master = self._masters.get(kid)
            if master is None and self._registered is not None and kid not in self._registered:
                self._unregistered.add(kid)
                raise KeyNotRegisteredError(
                    f"a part is sealed with a key this bucket never registered (written for "
                    f"another bucket?): key {kid.hex()} is neither the key of its "
                    f"{DESCRIPTOR} nor any {KEY_OBJECT}*"
                )
            if master is None:
                raise KeyNotHereError(
                    f"a part is sealed with key {kid.hex()}, which this device does not have "
                    "(another device's key file has it first: copy that file here and "
                    "restart ledgerd)"
                )
            aead = self._aeads[(kid, role)] = AESGCM(hkdf(master, b"part " + role.encode()))
        return aead

    def seal(self, plain: bytes, ctx: Context) -> bytes:
        """``plain`` padded, encrypted and authenticated with the write key, for ``ctx``."""
        kid = self.write_kid
        size = padded(_LEN.size + len(plain))
        body = b"".join([_LEN.pack(len(plain)), plain, bytes(size - _LEN.size - len(plain))])
        nonce = os.urandom(NONCE_LEN)
        return kid + nonce + self._aead(kid, ctx.role).encrypt(nonce, body, ctx.ad(kid))

    def open(self, sealed: bytes, ctx: Context) -> bytes:
        """The plain text of a part sealed for ``ctx``; TamperedError if it does not
        authenticate (altered, moved elsewhere, another key)."""
        if len(sealed) < OVERHEAD + MIN_PADDED:
            raise TamperedError("a sealed part is too short")
        kid, nonce = sealed[:KID_LEN], sealed[KID_LEN : KID_LEN + NONCE_LEN]
        try:
            body = self._aead(kid, ctx.role).decrypt(
                nonce, sealed[KID_LEN + NONCE_LEN :], ctx.ad(kid)
            )
        except InvalidTag:
            raise TamperedError(
                f"a sealed part ({ctx.role} of {ctx.object}) does not authenticate: it was "
                "altered or moved"
            ) from None
        (n,) = _LEN.unpack_from(body)
        if _LEN.size + n > len(body):
            raise TamperedError("a sealed part's length is wrong")
        return body[_LEN.size : _LEN.size + n]

    @staticmethod
    def key_id(sealed: bytes) -> bytes:
        return sealed[:KID_LEN]

    def device_tag(self, device_id: bytes) -> str:
        """The name a device has in this bucket: 32 hex digits of a keyed hash."""
        return hmac.new(self._names, b"device " + device_id, hashlib.sha256).hexdigest()[:32]

    def page_tag(self, ledger: bytes, page: bytes) -> str:
        """The name a page's checkpoints go under in this bucket (a keyed hash)."""
        msg = b"page " + len(ledger).to_bytes(2, "big") + ledger + page
        return hmac.new(self._names, msg, hashlib.sha256).hexdigest()[:32]

    def keyed_digest(self, digest: bytes) -> bytes:
        """A digest as it may appear in plain in the bucket (a name, a plain header):
        the same for every device of the bucket (dedup), and telling nothing of the
        content without the key."""
        return hmac.new(self._digests, digest, hashlib.sha256).digest()


# -- the bucket ----------------------------------------------------------------------


def is_crypto_object(name: str) -> bool:
    return name == DESCRIPTOR or name.startswith(KEY_OBJECT)


def key_object_id(name: str) -> bytes | None:
    """The key id a ``ledgerd-bucket.key.{id}`` name registers (None if it is not one)."""
    tail = name[len(KEY_OBJECT) :] if name.startswith(KEY_OBJECT) else ""
    if len(tail) != 2 * KID_LEN or not all(c in "0123456789abcdef" for c in tail):
        return None
    return bytes.fromhex(tail)


async def open_bucket(
    store: CloudStore,
    names: Iterable[str],
    keys: KeyRing | None,
    desc: Descriptor | None,
    encrypted: bool,
) -> Codec | None:
    """The bucket's codec (None for a bucket without encryption and a device without
    a key), from its descriptor ``desc`` (None if it has none), the names listed
    under the marker's prefix (its key objects) and whether it is ``encrypted`` (its
    descriptor, or its marker, says so). Writes nothing but this device's write key's
    key object, once (rotation). Raises a BucketIdentityError subclass when key and
    bucket do not go together."""
    if keys is None and (desc is not None or encrypted):
        raise EncryptionKeyMissingError(
            "encryption key missing: the bucket is encrypted and this device has no key "
            "(set encryption_key_file, LEDGERD_ENCRYPTION_KEY_FILE, or the systemd "
            f"credential {CREDENTIAL})"
        )
    if keys is None:
        return None
    if desc is None:
        _refuse_without_descriptor(keys, encrypted)
    masters = await _masters(keys, desc.salt, desc.n, desc.r, desc.p)
    kids = {kid: n for n in names if (kid := key_object_id(n)) is not None}
    secret = await _open_secret(store, keys, desc, masters, kids)
    codec = Codec(masters, secret, {desc.key, *kids})
    write = codec.write_kid
    if write != desc.key and write not in kids:
        with contextlib.suppress(AlreadyExistsError):
            await store.put(
                KEY_OBJECT + write.hex(), codec.seal(secret, Context(DESCRIPTOR, "secret"))
            )
        codec.register([write])
        log.info("registered encryption key %s in the bucket (it writes from now on)", write.hex())
    return codec


def _refuse_without_descriptor(keys: KeyRing, encrypted: bool) -> NoReturn:
    """A bucket without a descriptor, and a device with a key: refused."""
    if encrypted:  # (sync.context writes the descriptor of a new bucket first)
        raise ValueError("an encrypted bucket without its descriptor")
    raise BucketNotEncryptedError(
        "the bucket is not encrypted, and this device has an encryption key "
        f"({keys.source}): ledgerd does not mix plain and encrypted objects in a "
        "bucket. Use a new cloud URL for an encrypted bucket, or remove the key"
    )


async def _open_secret(
    store: CloudStore,
    keys: KeyRing,
    desc: Descriptor,
    masters: list[tuple[bytes, bytes]],
    kids: dict[bytes, str],
) -> bytes:
    """The bucket secret, opened with the first of ``masters`` that the descriptor or
    a key object (``kids``: key id -> its name) is sealed under; EncryptionKeyMismatchError
    if none opens it."""
    damaged: list[str] = []  # sealed under a key of this device, yet they do not open
    for kid, master in masters:
        if kid == desc.key:
            sealed, where = desc.secret, DESCRIPTOR
        elif kid in kids:
            sealed, where = await store.get(kids[kid]), kids[kid]
        else:
            continue
        try:
            return Codec([(kid, master)], b"").open(sealed, Context(DESCRIPTOR, "secret"))
        except TamperedError:
            damaged.append(f"{where} (key {kid.hex()})")
    if damaged:
        raise EncryptionKeyMismatchError(
            f"encryption key mismatch: {', '.join(damaged)} is sealed under a key this "
            "device has, yet does not open with it: it is damaged or was tampered with. "
            "Nothing was read from or written to the bucket"
        )
    known = sorted({desc.key.hex(), *(k.hex() for k in kids)})
    raise EncryptionKeyMismatchError(
        f"encryption key mismatch: none of this device's keys ({keys.source}: ids "
        f"{', '.join(k.hex() for k, _ in masters)}) opens the bucket (its keys: "
        f"{', '.join(known)}). Nothing was read from or written to it"
    )


async def _masters(keys: KeyRing, salt: bytes, n: int, r: int, p: int) -> list[tuple[bytes, bytes]]:
    return await asyncio.to_thread(keys.masters, salt, n, r, p)


async def create_descriptor(store: CloudStore, keys: KeyRing) -> Descriptor:
    """Write the encryption descriptor of a new bucket, only if absent, and return the
    one that landed: read back after the write, so that of two first devices writing
    at once both use the same one (on a store that refuses to overwrite, the first's;
    on one that does not, the last's, if both read after both wrote). The caller has
    checked that the bucket holds no data (:mod:`sync.context`)."""
    salt = secrets.token_bytes(SALT_LEN)
    kid, master = (await _masters(keys, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P))[0]
    secret = secrets.token_bytes(KEY_LEN)
    sealed = Codec([(kid, master)], b"").seal(secret, Context(DESCRIPTOR, "secret"))
    doc = {
        "ledgerd_encryption": 1,
        "aead": "AES-256-GCM",
        "salt": base64.b64encode(salt).decode(),
        "scrypt": {"n": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P},
        "key": kid.hex(),
        "secret": base64.b64encode(sealed).decode(),
    }
    ours = json.dumps(doc, sort_keys=True).encode()
    try:
        await store.put(DESCRIPTOR, ours)
        wrote = True
    except AlreadyExistsError:
        wrote = False
    landed = await store.get(DESCRIPTOR)
    if landed == ours:
        log.info("the bucket is encrypted with key %s", kid.hex())
    elif wrote:  # a store that overwrote: the other device's write came after ours
        log.warning("another device's %s replaced the one written here: it is used", DESCRIPTOR)
    else:
        log.info("another device wrote the bucket's %s first: it is used", DESCRIPTOR)
    return parse_descriptor(landed)


@dataclass(frozen=True)
class Descriptor:
    """``ledgerd-bucket.crypt``: the bucket's salt, scrypt cost, first key and secret."""

    salt: bytes
    n: int
    r: int
    p: int
    key: bytes
    secret: bytes = field(repr=False)

    @property
    def fingerprint(self) -> str:
        """A hash of the descriptor (of its salt, cost, key id and sealed secret, all
        public in the bucket): what each device remembers of it. Neither a key nor the
        bucket secret can be learnt from it."""
        h = hashlib.sha256(VERSION + b" descriptor")
        for part in (self.salt, self.key, self.secret):
            h.update(_LEN.pack(len(part)) + part)
        h.update(struct.pack(">QQQ", self.n, self.r, self.p))
        return h.hexdigest()


def parse_descriptor(raw: bytes) -> Descriptor:
    """The descriptor in ``raw``; BucketIdentityError (``bucket_unusable``) if it does
    not parse or asks for what this ledgerd does not do."""
    try:
        doc = json.loads(raw)
        kdf = doc["scrypt"]
        out = Descriptor(
            salt=base64.b64decode(doc["salt"], validate=True),
            n=int(kdf["n"]),
            r=int(kdf["r"]),
            p=int(kdf["p"]),
            key=bytes.fromhex(doc["key"]),
            secret=base64.b64decode(doc["secret"], validate=True),
        )
        if doc["ledgerd_encryption"] != 1 or doc["aead"] != "AES-256-GCM":
            raise ValueError("an encryption this ledgerd does not know")
        n, r, p = out.n, out.r, out.p
        if n < 2 or n & (n - 1) or r < 1 or p < 1 or 128 * n * r * p > SCRYPT_MOST_MEMORY:
            raise ValueError("scrypt cost out of bounds")
        if len(out.key) != KID_LEN or len(out.salt) < SALT_LEN:
            raise ValueError("bad key id or salt")
    except (ValueError, KeyError, TypeError) as e:
        raise BucketIdentityError(f"the bucket's {DESCRIPTOR} is unreadable: {e}") from None
    return out
