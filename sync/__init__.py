"""Cloud sync: pages to and from a bucket, through one CloudStore boundary.

:class:`sync.cloud.CloudStore` with its S3 (:mod:`sync.s3`) and folder
(:mod:`sync.folder`) implementations and retries (:class:`sync.cloud.Retrying`);
the pack format (:mod:`sync.pack`); the protocol and background loop
(:mod:`sync.engine`, a façade over its jobs: :mod:`sync.feed`, :mod:`sync.upload`,
:mod:`sync.download`, :mod:`sync.fetch`...); a counting store and moto's server for
the tests and benchmarks (:mod:`sync.testing`).
``sync`` sees the store only through its public API (:mod:`store.page.exchange`,
:class:`store.Repository`).
"""

from ledgerd.sync.cloud import CloudStore, Retrying, check_name
from ledgerd.sync.errors import (
    AlreadyExistsError,
    CloudError,
    CloudNotFoundError,
    InvalidNameError,
    PermanentCloudError,
    SyncError,
    TransientCloudError,
)

__all__ = [
    "AlreadyExistsError",
    "CloudError",
    "CloudNotFoundError",
    "CloudStore",
    "InvalidNameError",
    "PermanentCloudError",
    "Retrying",
    "SyncError",
    "TransientCloudError",
    "check_name",
]
