"""Signatures over a subject digest: one signing and one verification path for bundles and OCI images.

A signature document (JSON) says who vouches for which bytes, and until when::

    {"format": "ctbuild-signature", "version": 1, "algorithm": "ed25519" | "hmac-sha256",
     "statement": {"subject": "sha256:<hex>", "created": <unix time>, "sequence": <int> | null,
                   "expires": <unix time> | null},
     "key_id": "sha256:<hex of the public key>" (ed25519 only), "signature": "<base64>"}

The signature covers the canonical JSON of ``statement``. The *subject* is the digest of what is
signed: an OCI image's manifest digest (the manifest names its config and layer by digest, so the
whole image is covered), or for a bundle the SHA-256 of its canonical member-hash map.

Two kinds of key. Ed25519 (public key, the default for anything shared through a registry: the
builder keeps the private key, readers hold only the public one, so a reader cannot forge) and
HMAC-SHA256 (a shared secret of at least :data:`MIN_SECRET_BYTES` bytes, for offline bundles between
machines that share a secret). Ed25519 needs the ``cryptography`` package (``pip install
'ctbuild[sign]'``); it is imported only when a PEM key is used.

Freshness: a statement may carry a ``sequence`` (a number the builder increases with each release)
and an ``expires`` time. A reader refuses an expired statement always, and one whose sequence is
below ``min_sequence`` when it asks for one, so an older signed artifact cannot be replayed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CacheError
from .jsontext import dumps
from .user_files import FileTooLargeError, NotAFileError, read_regular, replacing

FORMAT = "ctbuild-signature"
VERSION = 1
ED25519 = "ed25519"
HMAC = "hmac-sha256"
MIN_SECRET_BYTES = 32
#: Largest key file read (bytes): PEM keys and secrets are far smaller.
MAX_KEY_FILE = 64 * 2**10
PEM_MARK = b"-----BEGIN "
INSTALL_HINT = "install it with `pip install 'ctbuild[sign]'` (the cryptography package)"


class SignatureError(CacheError):
    """A signature is missing, malformed, made with another key, stale, or for other bytes."""


@dataclass(frozen=True)
class Key:
    """A loaded key: an HMAC secret, an Ed25519 private key (signs) or public key (verifies)."""
    algorithm: str
    material: Any            # bytes (HMAC secret) or a cryptography key object
    private: bool
    key_id: str | None       # sha256 of the raw public key (Ed25519 only)
    path: str


def load_key(path: str | os.PathLike) -> Key:
    """An Ed25519 PEM key (private or public) or an HMAC secret file of at least 32 bytes."""
    where = os.fspath(path)
    try:
        data = read_regular(where, limit=MAX_KEY_FILE, what="a key file")
    except OSError as exc:
        raise CacheError(f"cannot read key file {where}: {exc.strerror}") from None
    except (NotAFileError, FileTooLargeError) as exc:  # a FIFO would block the command for ever
        raise CacheError(f"{exc}: give the key file's path") from None
    if data.lstrip().startswith(PEM_MARK):
        return _load_pem(data, where)
    secret = data.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise CacheError(f"key file {where} holds {len(secret)} bytes; use at least {MIN_SECRET_BYTES} random bytes, "
                         "e.g. `head -c 48 /dev/urandom | base64 > bundle.key`, or an Ed25519 key pair "
                         "from `ctbuild cache keygen`")
    return Key(HMAC, secret, True, None, where)


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise CacheError(f"public-key signatures need the cryptography package: {INSTALL_HINT}") from None
    return serialization, ed25519


def _load_pem(data: bytes, where: str) -> Key:
    serialization, ed25519 = _crypto()
    try:
        if b"PRIVATE KEY" in data.split(b"\n", 1)[0]:
            key = serialization.load_pem_private_key(data, password=None)
            private = True
        else:
            key = serialization.load_pem_public_key(data)
            private = False
    except (ValueError, TypeError) as exc:
        raise CacheError(f"key file {where} is not a readable unencrypted PEM key ({exc})") from None
    if not isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        raise CacheError(f"key file {where} holds a {type(key).__name__}; ctbuild signs with Ed25519 keys "
                         "(`ctbuild cache keygen`)")
    public = key.public_key() if private else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Key(ED25519, key, private, "sha256:" + hashlib.sha256(raw).hexdigest(), where)


def keygen(private_path: Path, public_path: Path, *, force: bool = False) -> str:
    """Write a new Ed25519 key pair (private key mode 0600); returns the key id. Never over an
    existing key unless ``force`` (a lost private key cannot be made again), never both keys
    to one file, and never one key without the other: both are written in full beside their
    paths before either is renamed into place (`ctbuild.cache.user_files`)."""
    serialization, ed25519 = _crypto()
    _check_key_paths(private_path, public_path, force)
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        with replacing(private_path, mode=0o600) as private_out, replacing(public_path) as public_out:
            private_out.write(private)
            public_out.write(public)
    except OSError as exc:
        raise CacheError(f"cannot write the key pair: {exc.strerror}: {exc.filename}; nothing was written") from None
    return _load_pem(public, str(public_path)).key_id or ""


def _check_key_paths(private_path: Path, public_path: Path, force: bool) -> None:
    if os.path.realpath(private_path) == os.path.realpath(public_path):
        raise CacheError(f"{private_path} and {public_path} are one file: the private and the public key "
                         "need a path each")
    if force:
        return
    for path in (private_path, public_path):
        if os.path.exists(path):
            raise CacheError(f"{path} exists; refusing to overwrite a key (remove it, choose another name, "
                             "or pass --force)")


def sign(subject: str, key: Key, *, sequence: int | None = None, expires: float | None = None) -> dict[str, Any]:
    """A signature document vouching for ``subject`` (a ``sha256:`` digest)."""
    if not key.private:
        raise CacheError(f"{key.path} is a public key; signing needs the private key")
    statement = {"subject": subject, "created": round(time.time(), 3), "sequence": sequence, "expires": expires}
    payload = dumps(statement, what="signature statement").encode()
    if key.algorithm == HMAC:
        raw = hmac.new(key.material, payload, hashlib.sha256).digest()
    else:
        raw = key.material.sign(payload)
    document = {"format": FORMAT, "version": VERSION, "algorithm": key.algorithm, "statement": statement,
                "signature": base64.b64encode(raw).decode()}
    if key.key_id:
        document["key_id"] = key.key_id
    return document


def subject_of(data: bytes) -> str:
    """The ``sha256:`` digest a statement names."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify(document: dict[str, Any] | None, subject: str, key: Key, *, what: str,
           min_sequence: int | None = None) -> dict[str, Any]:
    """Check ``document`` vouches for ``subject`` with ``key``; returns the statement.

    Raises SignatureError with one line naming the fault: missing, malformed, another key,
    invalid (changed after signing), for other content, expired, or older than ``min_sequence``.
    """
    if document is None:
        raise SignatureError(f"{what} is not signed, but a signature is required; nothing was imported")
    statement, raw = _parts(document, what)
    if document["algorithm"] != key.algorithm:
        raise SignatureError(f"{what} is signed with {document['algorithm']}, but the key {key.path} is "
                             f"{key.algorithm}: wrong key; nothing was imported")
    payload = dumps(statement, what="signature statement").encode()
    if key.algorithm == HMAC:
        good = hmac.compare_digest(hmac.new(key.material, payload, hashlib.sha256).digest(), raw)
    else:
        if document.get("key_id") != key.key_id:
            raise SignatureError(f"{what} was signed by key {document.get('key_id')}, not by {key.path} "
                                 f"({key.key_id}): wrong key; nothing was imported")
        public = key.material.public_key() if key.private else key.material
        good = _ed25519_ok(public, raw, payload)
    if not good:
        hint = "it was signed with another key or" if key.algorithm == HMAC else "the signature or its statement"
        raise SignatureError(f"{what} signature does not verify with {key.path}: {hint} was changed after "
                             "signing; nothing was imported")
    if statement["subject"] != subject:
        raise SignatureError(f"{what} does not match what was signed (signed {statement['subject'][:19]}..., "
                             f"found {subject[:19]}...): it was changed after signing; nothing was imported")
    _check_freshness(statement, what, min_sequence)
    return statement


def _ed25519_ok(public: Any, raw: bytes, payload: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    try:
        public.verify(raw, payload)
    except InvalidSignature:
        return False
    return True


def _parts(document: dict[str, Any], what: str) -> tuple[dict[str, Any], bytes]:
    """The statement and raw signature bytes of a well-formed document."""
    statement = document.get("statement") if isinstance(document, dict) else None
    ok = (isinstance(document, dict) and document.get("format") == FORMAT and document.get("version") == VERSION
          and document.get("algorithm") in (ED25519, HMAC) and isinstance(statement, dict)
          and isinstance(statement.get("subject"), str) and isinstance(document.get("signature"), str)
          and all(_number_or_none(statement.get(f)) for f in ("sequence", "expires", "created")))
    if not ok:
        raise SignatureError(f"{what} signature is malformed (not a {FORMAT} v{VERSION} document); "
                             "re-sign it with this ctbuild; nothing was imported")
    assert isinstance(statement, dict)
    try:
        raw = base64.b64decode(document["signature"], validate=True)
    except ValueError:
        raise SignatureError(f"{what} signature is not base64; nothing was imported") from None
    return statement, raw


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check_freshness(statement: dict[str, Any], what: str, min_sequence: int | None) -> None:
    expires = statement.get("expires")
    if expires is not None and expires < time.time():
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires))
        raise SignatureError(f"{what} signature expired at {when}; ask for a freshly signed one; nothing was imported")
    if min_sequence is not None:
        sequence = statement.get("sequence")
        if sequence is None or sequence < min_sequence:
            raise SignatureError(f"{what} has signed sequence {sequence}, below --min-sequence {min_sequence}: "
                                 "an older release; nothing was imported")


def parse_document(data: bytes, what: str) -> dict[str, Any]:
    """A signature document from bytes (already size-capped by the caller)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise SignatureError(f"{what} signature is not valid JSON; nothing was imported") from None
    if not isinstance(value, dict):
        raise SignatureError(f"{what} signature must be a JSON object; nothing was imported")
    return value
