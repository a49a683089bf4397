"""Where shards live: a local folder, or any `pyarrow.fs` URI (s3://, gs://, hdfs://, ...).

An object store has no memory map, so a host reads a remote shard once into a local cache
(pipeline.store.shard_cache) and maps that copy. S3 takes the standard AWS environment
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, and AWS_ENDPOINT_URL for an S3-protocol
server of your own, or `?endpoint_override=host:port&scheme=http` on the URI), with bounded
timeouts and retries so that a missing bucket, refused credentials or an unreachable endpoint
fail with the URI named, not hang.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

from stoker.protos.errors import NotFound, ResourceError

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
S3_ATTEMPTS = 3
CHUNK_BYTES = 8 << 20


class StorageError(ResourceError):
    """A shard, manifest or folder that cannot be read or written where its URI says."""


def is_remote(uri: str | Path) -> bool:
    return "://" in str(uri) and not str(uri).startswith("file://")


def filesystem(uri: str | Path) -> tuple[pafs.FileSystem, str]:
    """The filesystem that holds `uri`, and the path within it."""
    uri = str(uri)
    if uri.startswith("s3://"):
        return _s3(uri)
    if "://" in uri:
        try:
            return pafs.FileSystem.from_uri(uri)
        except (OSError, ValueError) as exc:
            raise StorageError(f"{uri}: {exc}") from exc
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def _s3(uri: str) -> tuple[pafs.S3FileSystem, str]:
    parts = urlsplit(uri)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    endpoint = query.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or \
        os.environ.get("AWS_ENDPOINT_URL")
    scheme = query.get("scheme")
    if endpoint and "://" in endpoint:  # AWS_ENDPOINT_URL is a URL; pyarrow wants host:port and a scheme
        scheme = scheme or urlsplit(endpoint).scheme
        endpoint = urlsplit(endpoint).netloc
    options = dict(connect_timeout=CONNECT_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S,
                   retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS),
                   region=query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                   or "us-east-1")
    if endpoint:
        options["endpoint_override"] = endpoint
    if scheme:
        options["scheme"] = scheme
    return pafs.S3FileSystem(**options), f"{parts.netloc}{parts.path}".rstrip("/")


def read_bytes(uri: str | Path) -> bytes:
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot read {uri}: {exc}") from exc


def file_size(uri: str) -> int:
    """Bytes of the file at `uri` (a HEAD request on an object store)."""
    fs, path = filesystem(uri)
    try:
        info = fs.get_file_info(path)
    except OSError as exc:
        raise StorageError(f"cannot read {uri}: {exc}") from exc
    if info.type == pafs.FileType.NotFound:
        raise NotFound(f"{uri}: no such file")
    return int(info.size or 0)


def copy_hashed(uri: str, out: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, int]:
    """Stream the file at `uri` into `out`, hashing each chunk as it is written, so checking a fetched
    shard costs no second read of it; returns (sha256 hex digest, bytes copied)."""
    fs, path = filesystem(uri)
    digest = hashlib.sha256()
    copied = 0
    try:
        with fs.open_input_stream(path) as stream:
            while chunk := stream.read(chunk_bytes):
                digest.update(chunk)
                out.write(chunk)
                copied += len(chunk)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot read {uri}: {exc}") from exc
    return digest.hexdigest(), copied


def writable_folder(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a folder to write, checked first (an S3 bucket is never made here)."""
    fs, path = filesystem(uri)
    try:
        if isinstance(fs, pafs.S3FileSystem):
            bucket = path.split("/", 1)[0]
            if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise StorageError(f"cannot write {uri}: bucket {bucket!r} does not exist (create it first)")
        else:
            fs.create_dir(path, recursive=True)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot write {uri}: {exc}") from exc
    return fs, path


def upload_folder(local: str | Path, uri: str) -> None:
    """Copy every file of a local folder to the folder `uri` (made by `stoker prepare` elsewhere)."""
    fs, path = writable_folder(uri)
    try:
        for file in sorted(Path(local).iterdir()):
            with open(file, "rb") as src, fs.open_output_stream(f"{path}/{file.name}") as dst:
                while chunk := src.read(8 << 20):
                    dst.write(chunk)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot write {uri}: {exc}") from exc


@contextmanager
def staged(dst: str | Path) -> Iterator[Path]:
    """A local folder to write a data set into: `dst` itself, or for a remote `dst` a temporary
    one whose files are uploaded there when the block ends without an error."""
    if not is_remote(dst):
        Path(dst).mkdir(parents=True, exist_ok=True)
        yield Path(dst)
        return
    writable_folder(str(dst))  # before the work, not after it
    local = Path(tempfile.mkdtemp(prefix="stoker-stage-"))
    try:
        yield local
        upload_folder(local, str(dst))
    finally:
        shutil.rmtree(local, ignore_errors=True)


def join(folder: str | Path, name: str) -> str:
    return f"{str(folder).rstrip('/')}/{name}" if is_remote(folder) else str(Path(folder) / name)
