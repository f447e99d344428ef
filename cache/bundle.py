"""Bundles: a cache's entries and blobs in one tar file, to ship a cache between machines or into
an image — this module imports them; :mod:`ctbuild.cache.bundle_export` writes them,
:mod:`ctbuild.cache.bundle_format` defines the format, :mod:`ctbuild.cache.import_undo` undoes a
failed import. The names other modules use (`export_bundle`, `import_bundle`, `read_key`, the
format's constants) are all importable from here.

What an import guarantees. Import checks the *whole* bundle first — member paths and types, the
manifest version, JSON shapes, every blob's digest, that every blob is referenced by an entry,
every entry's blob and every tuning record's winner is in the bundle or the store, and the
`ImportLimits` of :mod:`ctbuild.cache.bundle_limits` (member size and count, what the members take on
disk with a block per file against the free space, JSON size, nesting and values) — and raises
CacheError with nothing written if anything is wrong. Sizes and disk space are checked from each
tar header before its data is read; blobs are streamed in chunks; the JSON documents are kept as
bytes and parsed only after the signature (when one is required) verified, so memory stays
bounded by the JSON limit (about 8x it at most), whatever the bundle holds. Only then does it
store blobs, then entries (a compile entry after its blob, a tuning record after its winner); a
failure or interruption while storing (a full disk, Ctrl-C) puts the cache back as it was: replaced
entries get their previous values (kept, bounded, before each is replaced), added ones and blobs
are removed. Identical entries are left as
they are, so importing twice changes nothing; a differing entry is replaced by the bundle's.

What it does not guarantee without a signature: digests (xxh3-128) detect damage, not intent. Anyone
who can write a bundle can map any compile key to any CUBIN, and an unsigned import will serve it.
A bundle exported with a key (``sign_key``: an Ed25519 private key, or an HMAC-SHA256 secret, over the
SHA-256 of every member) and imported with ``require_key`` (the public key, or the same secret) is
accepted only if it was made by a holder of that key and not changed since; ``min_sequence`` refuses
an older signed release. Bundles and OCI images share one verification path (:func:`ctbuild.cache.signing.verify`).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tarfile
import zlib
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, Iterator

from .bundle_export import export_bundle
from .bundle_format import (
    BLOB_MEMBER,
    CHUNK,
    DOCUMENTS,
    FORMAT,
    MANIFEST,
    SIGNATURE,
    VERSION,
    members_subject,
)
from .bundle_limits import DiskBudget, ImportLimits, JsonBudget, check_members
from .entries import COMPILE_REQUIRED, TUNING_REQUIRED, fields_problem
from .errors import CacheError
from .import_undo import ImportUndo
from .jsontext import dumps
from .namespace import HashingReader
from .signing import Key, load_key, verify

if TYPE_CHECKING:
    from .namespace import ByteStream, Namespace
    from .store import Store

__all__ = ["BLOB_MEMBER", "CHUNK", "DEFAULT_LIMITS", "DOCUMENTS", "MANIFEST", "SIGNATURE", "VERSION",
           "ImportLimits", "export_bundle", "import_bundle", "read_key"]

DEFAULT_LIMITS = ImportLimits()


def read_key(path: str | os.PathLike) -> Key:
    """A signing or verifying key: an Ed25519 PEM key, or an HMAC secret of at least 32 bytes."""
    return load_key(path)


def import_bundle(store: Store, file: str | os.PathLike | IO[bytes], *, require_key: Key | None = None,
                  limits: ImportLimits = DEFAULT_LIMITS, min_sequence: int | None = None) -> dict[str, Any]:
    """Validate the whole bundle (and its signature, with ``require_key``; ``min_sequence`` refuses
    an older signed release) within ``limits``, then merge it into ``store``. Returns counts of what
    changed; on any failure nothing stays written."""
    with _input(file) as stream:
        checked = _validate(store, stream, require_key=require_key, limits=limits, min_sequence=min_sequence)
        stream.seek(0)
        undo = ImportUndo(store, limits.json_size)
        try:
            with _open_tar(stream) as tar:
                for member in _members(tar):
                    match = BLOB_MEMBER.fullmatch(member.name)
                    if match is not None:
                        _store_blob(store, tar, member, match.group(1), checked, undo)
            ns = store.namespaces
            written = unchanged = 0
            for namespace, name in ((ns.toolchains, "toolchains.json"), (ns.compile, "compile.json"),
                                    (ns.tuning, "tuning.json")):
                for key, entry in checked.documents[name].items():
                    if _merge(store, namespace, key, entry, undo,
                              tag=entry["digest"] if namespace is ns.compile else None):
                        written += 1
                    else:
                        unchanged += 1
        except BaseException as exc:
            state = undo.outcome()
            if isinstance(exc, KeyboardInterrupt):
                raise CacheError(f"import interrupted; {state}") from None
            if isinstance(exc, OSError):
                raise CacheError(f"import failed while storing ({exc.strerror or exc}); {state}") from None
            if isinstance(exc, CacheError):
                raise CacheError(f"{exc}; {state}") from None
            raise
    documents = checked.documents
    return {"blobs": len(checked.blobs), "blobs_added": len(undo.blobs), "entries_written": written,
            "entries_unchanged": unchanged, "compile_entries": len(documents["compile.json"]),
            "tuning_records": len(documents["tuning.json"]), "toolchains": len(documents["toolchains.json"]),
            "signed": bool(checked.sha256)}


def _store_blob(store: Store, tar: tarfile.TarFile, member: tarfile.TarInfo, digest: str, checked: _Checked,
                undo: ImportUndo) -> None:
    """Store one blob member, hashed on the way when the bundle is signed."""
    extracted: ByteStream = _extract(tar, member)
    if checked.sha256.get(member.name) is not None:
        extracted = HashingReader(extracted, hashlib.sha256())
    new = not store.has_blob(digest)
    if new:  # noted first: an interruption inside put_blob_stream must remove it too
        undo.blobs.append(digest)
    if not store.put_blob_stream(digest, extracted) and new:
        undo.blobs.pop()  # another writer stored it meanwhile: not this import's to remove
    if isinstance(extracted, HashingReader) and extracted.hexdigest() != checked.sha256[member.name]:
        raise CacheError(f"{member.name} changed while being imported; re-run the import")


def _merge(store: Store, namespace: Namespace, key: str, entry: dict[str, Any], undo: ImportUndo, *,
           tag: str | None) -> bool:
    """Write ``entry`` unless the same is stored; True if written."""
    text = dumps(entry, what=key)
    found = store.read_entry(namespace, key)
    if found is not None and found[1] == text and found[0].tag == tag:
        return False
    undo.note(namespace, key, None if found is None or type(found[1]) is not str else (found[1], found[0].tag))
    namespace.set(key, text, tag=tag)
    return True


class _Checked:
    """What pass 1 learnt: the JSON documents, the bundle's digests and member SHA-256s (signed
    bundles)."""

    def __init__(self) -> None:
        self.documents: dict[str, dict[str, Any]] = {}
        self.blobs: set[str] = set()
        self.sha256: dict[str, str] = {}


def _validate(store: Store, stream: IO[bytes], *, require_key: Key | None, limits: ImportLimits,
              min_sequence: int | None = None) -> _Checked:
    """Pass 1: check everything, write nothing. Members are walked once: sizes, counts and disk
    space are checked from each header before its data is read, blobs are hashed in chunks, the
    JSON members are kept as bytes and parsed only after the signature (if required) verified."""
    checked = _Checked()
    texts: dict[str, bytes] = {}
    hashes: dict[str, str] = {}
    disk = DiskBudget(store.path, limits)
    json_size = 0
    seen: set[str] = set()
    with _open_tar(stream) as tar:
        for index, member in enumerate(_members(tar)):
            _check_member(member, index, seen=seen, limits=limits)
            seen.add(member.name)
            if member.name in (MANIFEST, SIGNATURE) or member.name in DOCUMENTS:
                json_size += member.size
                if json_size > limits.json_size:
                    raise CacheError(f"bundle JSON documents exceed {limits.json_size / 2**20:.0f} MiB "
                                     "(--max-json-size): refusing the bundle; nothing was imported")
                texts[member.name] = data = _read(tar, member)
                if member.name != SIGNATURE:
                    hashes[member.name] = hashlib.sha256(data).hexdigest()
                continue
            digest = BLOB_MEMBER.fullmatch(member.name).group(1)  # type: ignore[union-attr]  # _check_member matched it
            if not store.has_blob(digest):
                disk.add_file(member.size)
            xxh, sha = _hash_member(tar, member)
            if xxh != digest:
                raise CacheError(f"bundle member {member.name} does not match its digest: the bundle is corrupt")
            hashes[member.name] = sha
            checked.blobs.add(digest)
    if MANIFEST not in texts:
        raise CacheError("bundle is empty: not a ctbuild cache bundle")
    budget = JsonBudget(limits)
    if require_key is not None:  # authenticity first: nothing the signer did not sign is parsed
        signed = texts.pop(SIGNATURE, None)
        _check_signature(None if signed is None else _as_object(SIGNATURE, budget.parse(SIGNATURE, signed)),
                         hashes, require_key, min_sequence)
        checked.sha256 = hashes
    _check_manifest(_as_object(MANIFEST, budget.parse(MANIFEST, texts.pop(MANIFEST))))
    for name in DOCUMENTS:
        text = texts.pop(name, b"{}")
        checked.documents[name] = _as_document(name, budget.parse(name, text))
        disk.add_rows(len(text), len(checked.documents[name]))
    _check_entries(store, checked)
    return checked


def _check_entries(store: Store, checked: _Checked) -> None:
    """Every entry usable, every blob used, every entry's blob and every tuning record's
    winner in the bundle or the cache."""
    documents = checked.documents
    required = {"toolchains.json": (), "compile.json": COMPILE_REQUIRED, "tuning.json": TUNING_REQUIRED}
    for name, document in documents.items():
        for key, entry in document.items():
            why = fields_problem(entry, required[name]) if key else "empty key"
            if why is not None:
                raise CacheError(f"bundle {name}: entry {key!r} is unusable ({why}); nothing was imported")
    referenced = {entry["digest"] for entry in documents["compile.json"].values()}
    if unused := sorted(checked.blobs - referenced):
        raise CacheError(f"bundle holds {len(unused)} blob(s) no compile entry uses (blobs/{unused[0]}, ...); "
                         "refusing the bundle; nothing was imported")
    for key, entry in documents["compile.json"].items():
        digest = entry["digest"]
        if digest not in checked.blobs and store.get_blob(digest) is None:
            raise CacheError(f"bundle compile.json: entry {key!r} needs blob {digest}, which is neither in the bundle "
                             "nor in the cache; nothing was imported")
    for key, record in documents["tuning.json"].items():
        winner = record["compile_key"]
        if winner not in documents["compile.json"] and not store.has_compile(winner):
            raise CacheError(f"bundle tuning.json: record {key!r} names compile key {winner!r}, which is neither in "
                             "the bundle nor in the cache: re-export the bundle with its compile entries; "
                             "nothing was imported")


def _check_signature(signature: dict[str, Any] | None, hashes: dict[str, str], key: Key,
                     min_sequence: int | None = None) -> None:
    if signature is None:
        raise CacheError(f"bundle is not signed ({SIGNATURE} is missing) but a signature is required; "
                         "re-export it with `ctbuild cache export --sign KEYFILE`; nothing was imported")
    members = signature.get("members")
    if not isinstance(members, dict) or not all(isinstance(v, str) for v in members.values()):
        raise CacheError(f"bundle {SIGNATURE} is malformed; nothing was imported")
    verify(signature, members_subject(members), key, what="bundle", min_sequence=min_sequence)
    if members != hashes:
        changed = sorted(set(members) ^ set(hashes) | {n for n in members if n in hashes and members[n] != hashes[n]})
        raise CacheError(f"bundle members {changed[:3]} differ from what was signed: the bundle was tampered with; "
                         "nothing was imported")


def _hash_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[str, str]:
    """(xxh3-128, SHA-256) of a member, read in chunks."""
    import xxhash

    extracted = _extract(tar, member)
    xxh, sha = xxhash.xxh3_128(), hashlib.sha256()
    while chunk := extracted.read(CHUNK):
        xxh.update(chunk)
        sha.update(chunk)
    return xxh.hexdigest(), sha.hexdigest()


def _check_member(member: tarfile.TarInfo, index: int, *, seen: set[str], limits: ImportLimits) -> None:
    """A member's header: a safe path of the format, a regular file, first the manifest, last
    the signature, each once, within the member limits."""
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in parts):
        raise CacheError(f"bundle member {name!r} has an unsafe path (absolute, '..' or odd): "
                         "refusing the bundle; nothing was imported")
    if not member.isreg():
        kind = ("symlink" if member.issym() else "hard link" if member.islnk()
                else "directory" if member.isdir() else "device or special file")
        raise CacheError(f"bundle member {name!r} is a {kind}; bundles hold regular files only: "
                         "refusing it; nothing was imported")
    match = BLOB_MEMBER.fullmatch(name)
    if name not in (MANIFEST, SIGNATURE) and name not in DOCUMENTS and not match:
        raise CacheError(f"bundle member {name!r} is not part of the bundle format v{VERSION}; nothing was imported")
    if name in seen:
        raise CacheError(f"bundle member {name!r} appears twice; the bundle is malformed")
    if SIGNATURE in seen:
        raise CacheError(f"bundle member {name!r} follows {SIGNATURE}, which must be last; nothing was imported")
    if member.size > limits.member_size:
        raise CacheError(f"bundle member {name} is {member.size / 2**20:.1f} MiB, above the "
                         f"{limits.member_size / 2**20:.0f} MiB limit (--max-member-size); refusing the bundle; "
                         "nothing was imported")
    if index == 0 and name != MANIFEST:
        raise CacheError(f"bundle does not start with {MANIFEST} (found {name!r}): not a ctbuild cache bundle")
    check_members(index + 1, limits)


def _check_manifest(manifest: dict[str, Any]) -> None:
    if manifest.get("format") != FORMAT:
        raise CacheError(f"{MANIFEST} says format {manifest.get('format')!r}, not {FORMAT!r}: "
                         "not a ctbuild cache bundle")
    if manifest.get("version") != VERSION:
        raise CacheError(f"bundle format version {manifest.get('version')!r} is not supported (this ctbuild reads "
                         f"version {VERSION}); import it with the ctbuild that exported it; nothing was imported")


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    extracted = tar.extractfile(member)
    assert extracted is not None  # _check_member allows regular files only
    return extracted


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    return _extract(tar, member).read()


def _as_object(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CacheError(f"bundle member {name} must be a JSON object; nothing was imported")
    return value


def _as_document(name: str, value: Any) -> dict[str, dict[str, Any]]:
    document = _as_object(name, value)
    if not all(isinstance(entry, dict) for entry in document.values()):
        raise CacheError(f"bundle member {name} must map keys to JSON objects; nothing was imported")
    return document


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members in order, without TarFile keeping every header it read (a bundle of a
    million members would keep them all)."""
    while (member := tar.next()) is not None:
        tar.members.clear()  # type: ignore[attr-defined]  # TarFile.members: typeshed leaves it out
        yield member


@contextmanager
def _open_tar(stream: IO[bytes]) -> Iterator[tarfile.TarFile]:
    try:
        tar = tarfile.open(fileobj=stream, mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        # tarfile lists each compression it tried on a line of its own: one line here
        why = "neither tar nor tar.gz, .bz2 or .xz" if "\n" in str(exc) else str(exc)
        raise CacheError(f"not a readable tar bundle ({why}); nothing was imported") from None
    try:
        with tar:
            yield tar
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise CacheError(f"bundle is truncated or damaged ({exc}); nothing was imported") from None


@contextmanager
def _input(file: str | os.PathLike | IO[bytes]) -> Iterator[IO[bytes]]:
    if isinstance(file, (str, os.PathLike)):
        try:
            stream = open(file, "rb")
        except OSError as exc:
            raise CacheError(f"cannot read bundle {os.fspath(file)}: {exc.strerror}") from None
        with stream:
            yield stream
    else:
        if not file.seekable():
            raise CacheError("import needs a seekable bundle file (it is read twice: check, then store)")
        yield file
