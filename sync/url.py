"""Opening a cloud store from its URL: ``s3://bucket/prefix`` or ``file:///path``.

This module owns what a cloud URL may be (:func:`url_problem`, which the daemon's
configuration also applies) and which store it opens; the stores are their own modules'.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from ledgerd.sync.cloud import CloudStore, Retrying
from ledgerd.sync.errors import PermanentCloudError
from ledgerd.sync.metered import CloudCounters, Metered

FILE_HOSTS = ("", "localhost")
"""The hosts a ``file:`` URL may name (RFC 8089): none, or this machine."""


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    deadline: float = 60.0,
    counters: CloudCounters | None = None,
) -> CloudStore:
    """The store for ``url``, with transient failures retried up to ``deadline`` seconds;
    every attempt counted in ``counters`` when given (:mod:`sync.metered`)."""
    if problem := url_problem(url):
        raise PermanentCloudError(problem)
    u = urlparse(url)
    inner: CloudStore
    # The stores are imported here, not at the top, for start-up speed: a folder store
    # need not load boto3.
    if u.scheme == "file":
        from ledgerd.sync.folder import FolderStore

        inner = FolderStore(Path(u.path))
    else:
        from ledgerd.sync.s3 import S3Store

        inner = S3Store(u.netloc, u.path.strip("/"), endpoint_url=endpoint_url or None)
    if counters is not None:
        inner = Metered(inner, counters)
    return Retrying(inner, deadline=deadline)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a cloud URL, as one sentence; None if it is one.

    A ``file:`` URL's path is absolute: ``file://relative/path`` names a host
    (``relative``) and the path ``/path``, so any host but none or ``localhost`` is
    refused, saying how to write the path the user meant."""
    u = urlparse(url)
    if u.scheme == "s3" and u.netloc:
        return None
    if u.scheme == "file" and u.netloc.lower() in FILE_HOSTS and u.path.startswith("/"):
        return None
    problem = f"unsupported cloud URL {url!r} (s3://bucket/prefix or file:///path)"
    if u.scheme == "file" and u.netloc:
        problem = (
            f"cloud URL {url!r} names the host {u.netloc!r}: a file: URL takes an absolute "
            "path after file:// (file:///srv/bucket); for a relative or home path write "
            f"it out, e.g. file://$PWD/{u.netloc}{u.path} or file://$HOME/{u.netloc}{u.path}"
        )
    return problem
