"""Local page storage: content-addressed objects in SQLite, and the embedded API.

``store`` has no network code and can be used on its own (embedded mode).
"""

from store.digest import Kind
from store.errors import (
    ClosedError,
    CorruptObjectError,
    InvalidArgumentError,
    ObjectNotFoundError,
    RangeError,
    StoreError,
    TransientStoreError,
)
from store.objects import ObjectStore, ValueRef

__all__ = [
    "ClosedError",
    "CorruptObjectError",
    "InvalidArgumentError",
    "Kind",
    "ObjectNotFoundError",
    "ObjectStore",
    "RangeError",
    "StoreError",
    "TransientStoreError",
    "ValueRef",
]
