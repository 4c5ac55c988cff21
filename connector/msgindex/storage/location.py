"""Where a store lives: a local directory, or a prefix of an object store bucket.

Every place that takes a store path (``msgindex.open``, the CLI, the data source, the pipeline)
parses it here, once, so that a URL is never taken for a local directory name (``s3://b/i``
used to become a folder ``s3:``). Accepted:

==========================================  ==================================================
``/data/index``, ``./index``, ``file:///x``   a local store (a POSIX directory: mmap, flock)
``s3://bucket/prefix`` (also ``s3a://``)      Amazon S3 or any S3-compatible endpoint
``gs://bucket/prefix``                        Google Cloud Storage
``az://container/prefix``, ``abfs[s]://container@account.dfs.core.windows.net/prefix``
                                              Azure Blob Storage / ADLS Gen2
==========================================  ==================================================

Endpoint and credentials come the way the clouds' SDKs take them (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``;
``GOOGLE_APPLICATION_CREDENTIALS``; ``AZURE_STORAGE_ACCOUNT_NAME`` ...; instance and web-identity
credentials), overridden per store by ``storage_options`` (the client library's option names:
``endpoint``, ``access_key_id``, ``secret_access_key``, ``region``, ``allow_http``, ``timeout``,
..., also in their environment spelling, ``AWS_ENDPOINT_URL``). Any other scheme is an error
naming it, never a local directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from msgindex.errors import InvalidOptionError

# scheme as written -> the kind of store (obstore parses the rest of the URL itself)
OBJECT_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az",
                  "adl": "az"}
LOCAL_SCHEME = "file"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(//)?")
ACCEPTED = "a local path, file://, s3://, gs://, az:// or abfs[s]://"


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store path (see the module docstring). ``url`` is what messages show."""

    url: str
    kind: str  # "file", "s3", "gs" or "az"
    local_path: Path | None = None
    bucket: str = ""  # bucket (S3, GCS) or container (Azure)
    prefix: str = ""  # keys under the bucket, without leading or trailing "/"
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.kind == LOCAL_SCHEME

    def __str__(self) -> str:
        return self.url


def is_object_store_url(root: object) -> bool:
    """True when `root` is a string naming an object store (any accepted scheme but file)."""
    if not isinstance(root, str):
        return False
    match = _SCHEME.match(root)
    return bool(match) and match.group(1).lower() in OBJECT_SCHEMES


def parse_location(root: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None) -> StoreLocation:
    """The location `root` names; InvalidOptionError (naming it) for an unknown scheme, a URL
    without a bucket, or storage options given for a local path."""
    options = dict(storage_options or {})
    for key, value in options.items():
        if not isinstance(key, str) or not key or not isinstance(value, (str, int, float, bool)):
            raise InvalidOptionError(f"storage option {key!r}={value!r}: names and values must be strings")
    if isinstance(root, os.PathLike):
        root = os.fspath(root)
    if not isinstance(root, str) or not root:
        raise InvalidOptionError(f"store path must be a non-empty string or path, got {root!r}")
    match = _SCHEME.match(root)
    scheme = match.group(1).lower() if match else ""
    if match and len(scheme) == 1 and os.name == "nt":  # a drive letter
        match, scheme = None, ""
    if not match or (scheme not in OBJECT_SCHEMES and scheme != LOCAL_SCHEME and not match.group(2)):
        return _local(root, options)
    if scheme == LOCAL_SCHEME:
        parts = urlsplit(root)
        if parts.netloc not in ("", "localhost"):
            raise InvalidOptionError(f"{root}: a file:// URL names a local path (file:///path), not host {parts.netloc!r}")
        return _local(unquote(parts.path), options)
    if scheme not in OBJECT_SCHEMES:
        raise InvalidOptionError(f"{root}: unknown scheme {scheme!r} (msgindex takes {ACCEPTED})")
    if not match.group(2):
        raise InvalidOptionError(f"{root}: {scheme}: URLs are written {scheme}://bucket/prefix")
    if "?" in root or "#" in root:  # a URL's query or fragment: the prefix would silently end before it
        raise InvalidOptionError(f"{root}: '?' and '#' cannot be part of a store URL (its prefix would end "
                                 f"before them, and another URL would name the same store)")
    parts = urlsplit(root)
    bucket = parts.netloc.split("@", 1)[0]
    if not bucket:
        raise InvalidOptionError(f"{root}: no bucket in the URL ({scheme}://bucket/prefix)")
    prefix = parts.path.strip("/")
    kind = OBJECT_SCHEMES[scheme]
    display = f"{scheme}://{parts.netloc}/{prefix}" if prefix else f"{scheme}://{parts.netloc}"
    return StoreLocation(display, kind, None, bucket, prefix, {k: str(v) for k, v in options.items()})


def _local(path: str, options: dict) -> StoreLocation:
    if options:
        raise InvalidOptionError(f"{path}: storage options {sorted(options)} are for object stores (s3://, gs://, "
                                 f"az://); this is a local path")
    return StoreLocation(path, LOCAL_SCHEME, Path(path))
