"""Exceptions raised by the sync layer.

Every error derives from :class:`SyncError`. Whether an error may go away on
retry is in the type: :class:`TransientCloudError` (timeouts, connection resets,
5xx, throttling) is retried with backoff; everything else is permanent and is
reported (access denied, no such bucket, a corrupt pack).
"""

from __future__ import annotations


class SyncError(Exception):
    """Cloud sync failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.__class__.__name__).strip())


class CloudError(SyncError):
    """The cloud store refused or failed a request."""


class TransientCloudError(CloudError):
    """A temporary cloud failure; the same request may succeed later."""


class PermanentCloudError(CloudError):
    """A cloud failure that retrying will not fix."""


class CloudNotFoundError(PermanentCloudError):
    """No such object in the cloud store."""


class AlreadyExistsError(PermanentCloudError):
    """The object already exists; objects are written once."""


class InvalidNameError(PermanentCloudError, ValueError):
    """Not a valid object name."""


class RangeNotInObjectError(PermanentCloudError):
    """The requested byte range starts at or past the end of the object."""


class NoBucketError(PermanentCloudError):
    """The bucket is not there (a folder moved away or unmounted, a bucket deleted)."""

    code = "bucket_not_found"


class BucketIdentityError(PermanentCloudError):
    """The bucket has no ledgerd marker, or one this ledgerd cannot use.

    ``code`` is stable (status's ``sync.bucket_error_code``, the API's error code):
    each cause of its own has a subclass with its own code."""

    code = "bucket_unusable"


class BucketIdentityMissingError(BucketIdentityError):
    """The bucket's marker or encryption descriptor is missing while the bucket holds
    data (or this device synced with it before): ledgerd does not start a new identity
    over it. Restore the object from a backup or another copy, or use a new cloud URL."""

    code = "bucket_identity_missing"


class BucketMarkerMissingError(BucketIdentityMissingError):
    """A bucket this device synced with before has no ledgerd marker any more (moved,
    unmounted or emptied): ledgerd does not start a new bucket in its place."""

    code = "bucket_marker_missing"


class BucketIdentityChangedError(BucketIdentityError):
    """The bucket's identity objects are not those this device synced with (another
    encryption descriptor, or encrypted where it was plain): the bucket was replaced
    or tampered with, and nothing is read from it or written to it."""

    code = "bucket_identity_changed"


class BucketLayoutError(BucketIdentityError):
    """The bucket's layout is one this ledgerd cannot read (a newer ledgerd's)."""

    code = "bucket_layout_unsupported"


class SyncTimeoutError(SyncError):
    """Sync did not finish in time."""


class SyncStoppedError(SyncError):
    """Sync was stopped: ledgerd is shutting down (what was pending goes up on the next
    start)."""

    code = "shutting_down"


class EncryptionError(SyncError):
    """Encryption failed."""


class KeyFileError(EncryptionError):
    """The encryption key file cannot be used."""


class TamperedError(EncryptionError):
    """A sealed part does not authenticate: it was altered, moved, or sealed with another key."""


class KeyNotHereError(TamperedError):
    """A part is sealed with a key this device does not have: not damaged, and it
    opens once that key is in this device's key file (and the daemon restarted)."""


class KeyNotRegisteredError(TamperedError):
    """A part is sealed with a key this bucket never registered (neither its
    descriptor's key nor any ``ledgerd-bucket.key.*``): it was written for another
    bucket, or forged. No key file opens it, so it is refused, not waited for."""


class EncryptionKeyMismatchError(BucketIdentityError):
    """encryption key mismatch: none of this device's keys opens the bucket."""

    code = "encryption_key_mismatch"


class EncryptionKeyMissingError(BucketIdentityError):
    """encryption key missing: the bucket is encrypted and this device has no key."""

    code = "encryption_key_missing"


class BucketNotEncryptedError(BucketIdentityError):
    """the bucket is not encrypted, and this device has an encryption key."""

    code = "bucket_not_encrypted"


class CorruptPackError(SyncError):
    """A pack is malformed or truncated; it was refused and nothing was stored."""


class PackKeyMissingError(CorruptPackError):
    """A pack is sealed with an encryption key this device does not have. It is not
    damaged: it opens once the key file that has the key is copied here and ledgerd
    restarted. (A CorruptPackError as well, so that every reader holds it unread, as
    it does a pack it cannot read; its state says which it is.)"""
