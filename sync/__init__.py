"""Cloud sync: the CloudStore boundary (S3, local folder) and, next, page upload/download.

Only the cloud boundary exists so far: :class:`sync.cloud.CloudStore` with its
S3 (:mod:`sync.s3`) and folder (:mod:`sync.folder`) implementations, retries
(:class:`sync.cloud.Retrying`) and test doubles (:mod:`sync.testing`). The page
protocol (packs, per-device logs, discovery, lazy fetch) is not written yet.
"""

from sync.cloud import CloudStore, Retrying, check_name
from sync.errors import (
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
