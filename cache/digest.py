"""Content digests: xxh3-128 in lowercase hex.

xxh3-128 is not a cryptographic hash; it detects corruption (torn writes, bit rot, truncation),
not a malicious writer. Whoever can write the cache can already run code in the build.
"""

import re
from typing import BinaryIO

import xxhash

DIGEST_RE = re.compile(r"[0-9a-f]{32}")


def digest_of(data: bytes) -> str:
    """The xxh3-128 hex digest of ``data`` — the address of a blob in the cache."""
    return xxhash.xxh3_128_hexdigest(data)


def is_digest(text: object) -> bool:
    """Whether ``text`` looks like a digest made by :func:`digest_of` (so it is safe as a file name)."""
    return isinstance(text, str) and DIGEST_RE.fullmatch(text) is not None


def digest_of_stream(stream: BinaryIO, chunk_size: int = 1 << 20) -> str:
    """The digest of everything left in ``stream``, read in chunks (bundle members may be large)."""
    hasher = xxhash.xxh3_128()
    while chunk := stream.read(chunk_size):
        hasher.update(chunk)
    return hasher.hexdigest()
