"""A :class:`~sync.cloud.CloudStore` on Amazon S3 or an S3-compatible store (boto3).

This module owns talking to S3: the client (standard AWS configuration:
environment variables including ``AWS_ENDPOINT_URL``, shared config and
credentials files, region; or an explicit ``endpoint_url`` for MinIO, R2,
Backblaze and others), running its blocking calls on a bounded pool of daemon
threads so the event loop never waits, and sorting its errors into transient and
permanent. Retries happen in :class:`sync.cloud.Retrying`, so botocore's own are
turned off (one attempt per call).

Why daemon threads (:class:`BlockingCalls`), not a ``ThreadPoolExecutor``: a boto3 call
cannot be cancelled, and an endpoint that accepts connections and never answers holds
one for up to ``timeout`` seconds per read. The interpreter joins a
``ThreadPoolExecutor``'s threads as it exits, so such a call kept a stopped daemon
alive (past systemd's ``TimeoutStopSec``) after everything else had closed. A call
left running at exit is abandoned: what it was uploading goes up again on the next
start.
"""

from __future__ import annotations

import functools
import logging
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
)

from ledgerd.store import BlockingCalls as StoreBlockingCalls
from ledgerd.sync.cloud import CloudStore, check_name, check_prefix, filtered_names
from ledgerd.sync.errors import (
    AlreadyExistsError,
    CloudError,
    CloudNotFoundError,
    NoBucketError,
    PermanentCloudError,
    RangeNotInObjectError,
    TransientCloudError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_CODES = {
    "RequestTimeout",
    "RequestTimeoutException",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalError",
    "ServiceUnavailable",
    "TooManyRequests",
    "PriorRequestNotComplete",
    "OperationAborted",
}
NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
CREDENTIALS_HINT = (
    "ledgerd reads them as the AWS CLI does: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY,"
    " or AWS_PROFILE and ~/.aws/credentials, or an instance role"
)
EXISTS_CODES = {"PreconditionFailed", "412"}


def classify(e: Exception, what: str) -> CloudError:
    """Our error for a botocore error: transient (retry) or permanent (report)."""
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = f"{what}: {code or status} {err.get('Message', '')}".strip()
        if code in NOT_FOUND_CODES:
            return CloudNotFoundError(msg)
        if code == "NoSuchBucket":
            return NoBucketError(msg)
        if code in EXISTS_CODES or status == 412:
            return AlreadyExistsError(msg)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientCloudError(msg)
        return PermanentCloudError(msg)
    if isinstance(e, EndpointConnectionError):
        return TransientCloudError(f"{what}: {unreachable(e)}")
    if isinstance(e, ConnectionError | HTTPClientError):
        return TransientCloudError(f"{what}: {e}")
    if isinstance(e, NoCredentialsError):  # (botocore's line says nothing of where they go)
        return PermanentCloudError(f"{what}: {e} ({CREDENTIALS_HINT})")
    if isinstance(e, BotoCoreError):
        # Missing credentials, bad configuration: nothing a retry would fix.
        return PermanentCloudError(f"{what}: {e}")
    return PermanentCloudError(f"{what}: {type(e).__name__}: {e}")


def unreachable(e: EndpointConnectionError) -> str:
    """``cannot reach http://host:port (connection refused)``: the endpoint (without the
    request's path) and the system's reason, rather than botocore's URL with its query."""
    url = urllib.parse.urlsplit(str(e.kwargs.get("endpoint_url", "")))
    cause: BaseException | None = e.kwargs.get("error")
    reason = str(cause) if cause is not None else "no connection"
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror.lower()
            break
        cause = cause.__cause__ or cause.__context__
    return f"cannot reach {url.scheme}://{url.netloc} ({reason})"


class BlockingCalls(StoreBlockingCalls):
    """:class:`store.sqlite.threads.BlockingCalls` whose calls after :meth:`close` raise
    PermanentCloudError (see the module docstring for why daemon threads)."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(
            workers, name, closed=lambda: PermanentCloudError("the S3 store was closed")
        )


class S3Store(CloudStore):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        concurrency: int = 16,
        timeout: float = 30.0,
        conditional_put: bool = True,
        page_size: int = 1000,
    ) -> None:
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if self.prefix:
            check_name(self.prefix[:-1])
        config = Config(
            # One attempt per call (botocore's max_attempts counts retries, not attempts).
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=concurrency,
            connect_timeout=timeout,
            read_timeout=timeout,
        )
        session = boto3.session.Session(region_name=region)
        self.client = session.client("s3", endpoint_url=endpoint_url, config=config)
        self.conditional_put = conditional_put
        self.page_size = page_size
        self._calls = BlockingCalls(concurrency, "s3")

    async def _run(self, fn: Callable[[], T], what: str) -> T:
        try:
            return await self._calls.run(fn)
        except CloudError:
            raise
        except Exception as e:
            err = classify(e, what)
            if isinstance(err, NoBucketError):  # name it, and say what to do
                err = NoBucketError(
                    f"the S3 bucket {self.bucket} does not exist (ledgerd creates no S3 "
                    f"bucket: create it first, e.g. {self.make_bucket_command()}): {err}"
                )
            raise err from e

    def make_bucket_command(self) -> str:
        """The ``aws`` command that creates the bucket, at the configured endpoint if any
        (without one, ``aws`` finds ``AWS_ENDPOINT_URL`` itself, as boto3 does)."""
        endpoint = f" --endpoint-url {self.endpoint_url}" if self.endpoint_url else ""
        return f"aws s3 mb s3://{self.bucket}{endpoint}"

    def _key(self, name: str) -> str:
        return self.prefix + check_name(name)

    async def put(self, name: str, data: bytes) -> None:
        key = self._key(name)
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if self.conditional_put else {}

        def call() -> None:
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra)
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code", ""))
                if extra and code in ("NotImplemented", "InvalidArgument"):
                    # A store without conditional writes: the key is ours alone anyway.
                    log.info(
                        "%s does not support If-None-Match; writing unconditionally", self.bucket
                    )
                    self.conditional_put = False
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
                    return
                raise

        await self._run(call, f"put {key}")

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        key = self._key(name)
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if offset or length is not None:
            if length == 0:
                return b""
            end = "" if length is None else str(offset + length - 1)
            args["Range"] = f"bytes={offset}-{end}"

        def call() -> bytes:
            try:
                body = self.client.get_object(**args)["Body"]
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") == "InvalidRange":
                    raise RangeNotInObjectError(
                        f"get {key}: range from {offset} is past the end of the object"
                    ) from e
                raise
            try:
                return bytes(body.read())
            finally:
                body.close()

        return await self._run(call, f"get {key}")

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        check_prefix(prefix)
        full = self.prefix + prefix
        start = self.prefix + after if after else ""
        token: str | None = None
        while True:
            args: dict[str, Any] = {
                "Bucket": self.bucket,
                "Prefix": full,
                "MaxKeys": self.page_size,
            }
            if token:
                args["ContinuationToken"] = token
            elif start:
                args["StartAfter"] = start
            page: dict[str, Any] = await self._run(
                functools.partial(self.client.list_objects_v2, **args), f"list {full}"
            )

            async def names(p: dict[str, Any] = page) -> AsyncIterator[str]:
                for obj in p.get("Contents", []):
                    yield str(obj["Key"])[len(self.prefix) :]

            async for n in filtered_names(names(), f"s3://{self.bucket}/{self.prefix}"):
                yield n
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    async def delete(self, name: str) -> None:
        key = self._key(name)
        await self._run(
            lambda: self.client.delete_object(Bucket=self.bucket, Key=key), f"delete {key}"
        )

    async def close(self) -> None:
        self._calls.close()  # a call in flight may hang: it is not waited for
        self.client.close()
