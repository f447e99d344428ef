"""An OCI image layout on disk (``oci-layout``, ``index.json``, ``blobs/sha256/``): the target
for builds with no registry. ``skopeo copy oci:DIR:TAG docker://...`` pushes it later.

Tags are ``org.opencontainers.image.ref.name`` annotations in ``index.json``; signatures are
listed there too (descriptors with an ``artifactType``), found by their manifest's ``subject``.
Every file is written to a temp name and renamed, so a failed push leaves no torn blob; one
writer at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any

from ..errors import CacheError
from . import MAX_DOCUMENT, OCI_INDEX, SIGNATURE_TYPE
from .blobs import check_descriptor, copy_verified, parse_json, read_capped

REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT_FILE = "oci-layout"


class Layout:
    """An OCI image layout directory."""

    def __init__(self, root: str | os.PathLike, *, create: bool = False) -> None:
        self.root = Path(root)
        if create:
            try:
                (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
                if not (self.root / LAYOUT_FILE).exists():
                    self._write(self.root / LAYOUT_FILE, b'{"imageLayoutVersion":"1.0.0"}')
            except OSError as exc:
                raise CacheError(f"cannot write the OCI layout {self.root}: {exc.strerror}") from None
        elif not (self.root / LAYOUT_FILE).is_file():
            raise CacheError(f"no OCI image layout at {self.root} (no {LAYOUT_FILE} file): check --layout")

    def describe(self) -> str:
        return f"OCI layout {self.root}"

    def _blob(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.split(":", 1)[1]

    # -- reading -------------------------------------------------------------------------------
    def _index(self) -> dict[str, Any]:
        path = self.root / "index.json"
        if not path.exists():
            return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        with open(path, "rb") as f:
            index = parse_json(read_capped(f, MAX_DOCUMENT, f"{path}"), f"{path}")
        if not isinstance(index.get("manifests"), list):
            raise CacheError(f"{path} has no manifests list: not an OCI image layout")
        return index

    def get_manifest(self, name: str) -> tuple[bytes, str, str | None] | None:
        """The manifest named by tag (``ref.name``) or digest: its bytes, media type and the digest
        index.json gives it (the caller checks the bytes against it); None if absent."""
        for entry in self._index()["manifests"]:
            if not isinstance(entry, dict):
                continue
            if entry.get("digest") == name or (entry.get("annotations") or {}).get(REF_NAME) == name:
                check_descriptor(entry, f"{self.root}/index.json entry for {name}")
                return self._read_blob(entry["digest"], MAX_DOCUMENT), entry["mediaType"], entry["digest"]
        return None

    def _read_blob(self, digest: str, cap: int) -> bytes:
        try:
            with open(self._blob(digest), "rb") as f:
                return read_capped(f, cap, f"blob {digest[:19]}... in {self.root}")
        except FileNotFoundError:
            raise CacheError(f"{self.describe()} lacks blob {digest}: the layout is incomplete") from None

    def fetch_blob(self, digest: str, size: int, out: IO[bytes], what: str) -> None:
        try:
            with open(self._blob(digest), "rb") as f:
                copy_verified(f, out, digest, size, what)
        except FileNotFoundError:
            raise CacheError(f"{self.describe()} lacks {what} ({digest}): the layout is incomplete") from None

    def has_blob(self, digest: str) -> bool:
        return self._blob(digest).is_file()

    def referrers(self, digest: str) -> list[dict[str, Any]]:
        """Signature descriptors whose manifest names ``digest`` as its subject."""
        found = []
        for entry in self._index()["manifests"]:
            if isinstance(entry, dict) and entry.get("artifactType") == SIGNATURE_TYPE:
                data = self._read_blob(check_descriptor(entry, "index.json entry")["digest"], MAX_DOCUMENT)
                subject = parse_json(data, "signature manifest").get("subject")
                if isinstance(subject, dict) and subject.get("digest") == digest:
                    found.append(entry)
        return found

    # -- writing -------------------------------------------------------------------------------
    def put_blob(self, digest: str, size: int, source: str | bytes) -> None:
        if self.has_blob(digest):
            return
        if isinstance(source, bytes):
            self._write(self._blob(digest), source)
            return
        self._copy(source, self._blob(digest))

    def put_manifest(self, name: str, data: bytes, media_type: str, **extra: Any) -> None:
        """Store a manifest and list it in index.json under the tag ``name`` (None: untagged)."""
        from .blobs import descriptor

        entry = descriptor(media_type, data, **extra)
        self.put_blob(entry["digest"], len(data), data)
        index = self._index()
        keep = [m for m in index["manifests"]
                if not (isinstance(m, dict) and ((name and (m.get("annotations") or {}).get(REF_NAME) == name)
                                                 or (not name and m.get("digest") == entry["digest"])))]
        if name:
            entry["annotations"] = {REF_NAME: name}
        index["manifests"] = [*keep, entry]
        self._write(self.root / "index.json", json.dumps(index, indent=2).encode())

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def _copy(self, source: str, path: Path) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out, open(source, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
