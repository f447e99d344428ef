"""Image references: ``registry[:port]/repository[:tag][@sha256:hex]``, as docker and skopeo spell them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import CacheError

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
REPOSITORY = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
DEFAULT_REGISTRY = "registry-1.docker.io"


@dataclass(frozen=True)
class Reference:
    """A parsed reference; ``tag`` or ``digest`` (or both) name the image."""
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """What the registry's manifest endpoint takes: the digest if given, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        at = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tag}{at}"


def parse_reference(text: str) -> Reference:
    """Parse a registry reference; a name with no registry host is Docker Hub's (``library/`` added)."""
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        check_digest(digest, text)
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, remainder
    else:
        registry, path = DEFAULT_REGISTRY, rest if "/" in rest else f"library/{rest}"
    tag = None
    if ":" in path.rsplit("/", 1)[-1]:
        path, tag = path.rsplit(":", 1)
        if not TAG.fullmatch(tag):
            raise CacheError(f"invalid tag {tag!r} in {text!r}: letters, digits, '_', '.', '-' (at most 128)")
    if not REPOSITORY.fullmatch(path):
        raise CacheError(f"invalid image reference {text!r}: expected REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST] "
                         "with a lower-case repository, e.g. localhost:5000/kernels:v1")
    return Reference(registry, path, tag if tag or digest else "latest", digest)


def parse_layout_name(text: str) -> tuple[str | None, str | None]:
    """(tag, digest) of a name inside an OCI image layout: ``TAG``, ``sha256:HEX`` or ``TAG@sha256:HEX``."""
    tag, _, digest = text.partition("@")
    if DIGEST.fullmatch(tag) and not digest:
        return None, tag
    if digest:
        check_digest(digest, text)
    if not TAG.fullmatch(tag):
        raise CacheError(f"invalid name {text!r} for an OCI layout: give a tag (e.g. v1) or sha256:DIGEST")
    return tag, digest or None


def check_digest(digest: str, text: str) -> None:
    if not DIGEST.fullmatch(digest):
        raise CacheError(f"invalid digest {digest!r} in {text!r}: expected sha256: and 64 lower-case hex digits")
