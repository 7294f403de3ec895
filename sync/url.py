"""Opening a cloud store from its URL: ``s3://bucket/prefix`` or ``file:///path``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from ledgerd.sync.cloud import CloudStore, Retrying
from ledgerd.sync.errors import PermanentCloudError
from ledgerd.sync.metered import CloudCounters, Metered


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    deadline: float = 60.0,
    counters: CloudCounters | None = None,
) -> CloudStore:
    """The store for ``url``, with transient failures retried up to ``deadline`` seconds;
    every attempt counted in ``counters`` when given (:mod:`sync.metered`)."""
    u = urlparse(url)
    inner: CloudStore
    if u.scheme == "file" and u.path.startswith("/"):
        from ledgerd.sync.folder import FolderStore

        inner = FolderStore(Path(u.path))
    elif u.scheme == "s3" and u.netloc:
        from ledgerd.sync.s3 import S3Store

        inner = S3Store(u.netloc, u.path.strip("/"), endpoint_url=endpoint_url or None)
    else:
        raise PermanentCloudError(
            f"unsupported cloud URL {url!r} (s3://bucket/prefix or file:///path)"
        )
    if counters is not None:
        inner = Metered(inner, counters)
    return Retrying(inner, deadline=deadline)
