"""Content addressing shared by the registry and layout targets: every byte read is checked
against the digest and size its descriptor names, and every document is read under a cap."""

from __future__ import annotations

import hashlib
import json
from typing import IO, Any

from ..errors import CacheError

CHUNK = 1 << 20


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    """An OCI descriptor of ``data``."""
    return {"mediaType": media_type, "digest": sha256_digest(data), "size": len(data), **extra}


def read_capped(stream: IO[bytes], cap: int, what: str) -> bytes:
    """At most ``cap`` bytes of ``stream``; more is refused (a document this big is not ours)."""
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise CacheError(f"{what} is larger than {cap // 1024} KiB: refusing it; nothing was written")
    return data


def copy_verified(stream: IO[bytes], out: IO[bytes], digest: str, size: int, what: str) -> None:
    """Copy exactly ``size`` bytes from ``stream`` to ``out``, checking their SHA-256 is ``digest``."""
    sha = hashlib.sha256()
    left = size
    while left > 0:
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            raise CacheError(f"{what} ended after {size - left} of {size} bytes: truncated; nothing was written")
        sha.update(chunk)
        out.write(chunk)
        left -= len(chunk)
    if stream.read(1):
        raise CacheError(f"{what} is longer than the {size} bytes its descriptor says: tampered; nothing was written")
    check_digest(digest, "sha256:" + sha.hexdigest(), what)


def check_digest(expected: str, actual: str, what: str) -> None:
    if actual != expected:
        raise CacheError(f"{what} does not match its digest (expected {expected[:19]}..., got {actual[:19]}...): "
                         "it was tampered with or damaged; nothing was written")


def parse_json(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object from a capped document; one-line errors for anything else (a depth bomb included)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise CacheError(f"{what} is not valid JSON; nothing was written") from None
    if not isinstance(value, dict):
        raise CacheError(f"{what} must be a JSON object; nothing was written")
    return value


def check_descriptor(value: Any, what: str) -> dict[str, Any]:
    """A descriptor's shape: mediaType, a sha256 digest and a non-negative size."""
    from .reference import DIGEST

    ok = (isinstance(value, dict) and isinstance(value.get("mediaType"), str)
          and isinstance(value.get("digest"), str) and DIGEST.fullmatch(value["digest"]) is not None
          and isinstance(value.get("size"), int) and not isinstance(value["size"], bool) and value["size"] >= 0)
    if not ok:
        raise CacheError(f"{what} is not a valid OCI descriptor (mediaType, sha256 digest, size); nothing was written")
    return value
