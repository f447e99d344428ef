"""The ``ctbuild cache push``, ``pull`` and ``keygen`` subcommands (parsers and runners).

``ctbuild.cache.cli`` registers them; each runner returns ``(result, text, exit code)`` like the other
cache commands and raises CacheError for bad input (one line, exit 2).
"""

from __future__ import annotations

import argparse
import re
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from ..bundle_export import left_out_line
from ..bundle_limits import ImportLimits
from ..errors import CacheError
from ..signing import keygen, load_key
from . import DEFAULT_READ_TIMEOUT_S, DEFAULT_TIMEOUT_S
from .reference import Reference, parse_layout_name, parse_reference

USER_ENV, PASSWORD_ENV = "CTBUILD_REGISTRY_USER", "CTBUILD_REGISTRY_PASSWORD"

DURATION = re.compile(r"(\d+)([smhd]?)")
SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

PUSH_EPILOG = f"""\
examples:
  ctbuild cache push --cache /cache localhost:5000/kernels:h100
  ctbuild cache push --arch sm_90 --sign ci.pem --sequence 7 registry.example.com/team/kernels:v7
  ctbuild cache push --layout ./oci v7          an OCI image layout on disk (REF: a tag), no registry

The image is one layer (the cache bundle, tar+gzip) with cache.ctbuild.image/* and io.kserve.km/*
labels; see docs/deployment.md. Credentials: ${USER_ENV} and ${PASSWORD_ENV} (basic, or
for a bearer token), else those `docker login` stored; none for anonymous access."""

PULL_EPILOG = """\
examples:
  ctbuild cache pull localhost:5000/kernels:h100 --cache /cache
  ctbuild cache pull registry.example.com/team/kernels@sha256:... --require-signature --key ci.pub.pem
  ctbuild cache pull v7 --layout ./oci --arch sm_90 --cache /cache

Before anything is written: the manifest and config digests, media types, the signature (with
--require-signature, before any other blob is fetched), the arch (this GPU's exact sm, or --arch
where no GPU is visible), the layer size against the free space; then the layer, digest-checked,
goes through the same checks and bounds as `ctbuild cache import`."""


def add_parsers(sub: Any, common: argparse.ArgumentParser, parse_archs: Any, parse_size: Any,
                max_member_size: int) -> None:
    """Add push, pull and keygen to the ``cache`` subparsers."""
    fmt = argparse.RawDescriptionHelpFormatter
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--layout", type=Path, metavar="DIR",
                       help="an OCI image layout directory instead of a registry; REF is then a tag or sha256:DIGEST")
    where.add_argument("--plain-http", action="store_true",
                       help="talk to the registry over http (default: https, http for localhost)")
    where.add_argument("--timeout", type=parse_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                       help="give up, writing nothing, when the registry has not finished this long after "
                            f"the first request (default {DEFAULT_TIMEOUT_S:g}; raise it for a large image "
                            "over a slow link)")
    where.add_argument("--read-timeout", type=parse_seconds, default=DEFAULT_READ_TIMEOUT_S, metavar="SECONDS",
                       help="give up when one connect, read or write waits this long for the registry "
                            f"(default {DEFAULT_READ_TIMEOUT_S:g})")

    push = sub.add_parser("push", parents=[common, where], help="push the cache to a registry as an OCI image",
                          epilog=PUSH_EPILOG, formatter_class=fmt,
                          description="Push the cache (or the entries of --arch) as a one-layer OCI image, "
                                      "optionally signed with an Ed25519 key.")
    push.add_argument("ref", metavar="REF", help="image reference, e.g. localhost:5000/kernels:v1")
    push.set_defaults(check=partial(check_ref, push=True))
    push.add_argument("--arch", type=parse_archs, metavar="ARCHS", help="only these archs, comma-separated")
    add_signing_args(push, "sign the image's manifest digest with this Ed25519 private key (`ctbuild cache keygen`); "
                           "the signature is attached as an OCI referrer")

    pull = sub.add_parser("pull", parents=[common, where], help="pull a cache image, check it, import it",
                          epilog=PULL_EPILOG, formatter_class=fmt,
                          description="Pull a cache image pushed by `ctbuild cache push`, check it and merge it into "
                                      "the cache; nothing is written unless every check passes.")
    pull.add_argument("ref", metavar="REF", help="image reference (tag or @sha256:DIGEST)")
    pull.set_defaults(check=partial(check_ref, push=False))
    pull.add_argument("--arch", metavar="SM", help="the GPU arch to pull for where no GPU is visible, e.g. sm_90")
    pull.add_argument("--require-signature", action="store_true",
                      help="refuse the image unless a signature made with --key's private key is attached")
    pull.add_argument("--key", type=Path, metavar="PUB.pem", help="Ed25519 public key for --require-signature")
    pull.add_argument("--min-sequence", type=int, metavar="N",
                      help="refuse a signature whose sequence is below N (an older release)")
    pull.add_argument("--max-member-size", type=parse_size, default=max_member_size, metavar="SIZE",
                      help=f"as for import (default {max_member_size // 2**20}M)")

    key = sub.add_parser("keygen", parents=[common], help="write an Ed25519 key pair for signing",
                         description="Write a new Ed25519 private key (mode 0600) and its public key, PEM. Sign with "
                                     "the private key (push/export --sign); give readers the public one.",
                         epilog="example: ctbuild cache keygen ci.pem ci.pub.pem", formatter_class=fmt)
    key.add_argument("private", type=Path, metavar="PRIVATE.pem",
                     help="private key to write (never over an existing file without --force)")
    key.add_argument("public", type=Path, metavar="PUBLIC.pem", help="public key to write (another path)")
    key.add_argument("--force", action="store_true",
                     help="replace existing key files (the old private key is lost)")


def add_signing_args(parser: argparse.ArgumentParser, sign_help: str) -> None:
    """--sign, --sequence and --expires-in (shared by push and export)."""
    parser.add_argument("--sign", type=Path, metavar="KEYFILE", help=sign_help)
    parser.add_argument("--sequence", type=int, metavar="N",
                        help="a release number to sign with (increase it with each release; readers can refuse "
                             "older ones with --min-sequence)")
    parser.add_argument("--expires-in", type=parse_duration, metavar="DURATION",
                        help="the signature expires after this long, e.g. 90d, 12h (default: never)")


def parse_seconds(text: str) -> float:
    """A positive number of seconds (``--timeout``, ``--read-timeout``)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r}: give a positive number, e.g. 300")
    return seconds


def parse_duration(text: str) -> int:
    match = DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: a positive number with s, m, h or d, e.g. 90d")
    return int(match.group(1)) * SECONDS[match.group(2)]


def signing_options(args: argparse.Namespace) -> dict[str, Any]:
    """The key and statement fields --sign, --sequence and --expires-in ask for."""
    import time

    if args.sign is None and (args.sequence is not None or args.expires_in is not None):
        raise CacheError("--sequence and --expires-in go with --sign KEYFILE")
    return {"key": load_key(args.sign) if args.sign else None, "sequence": args.sequence,
            "expires": None if args.expires_in is None else round(time.time() + args.expires_in)}


def check_ref(args: argparse.Namespace, *, push: bool) -> tuple[Reference | None, str]:
    """REF read as --layout says: (the registry reference, None in a layout; the name to push
    or pull). Reads, creates and connects nothing: the parsers' ``check``, run before anything
    else (and by the docs test on every example)."""
    if args.layout is not None:
        tag, digest = parse_layout_name(args.ref)
        ref, name = None, digest or tag or "latest"
    else:
        ref = parse_reference(args.ref)
        digest, name = ref.digest, ref.name
    if push and digest:
        raise CacheError(f"push takes a tag, not a digest ({args.ref}): the digest is the result")
    return ref, name


def target_of(args: argparse.Namespace, *, push: bool) -> tuple[Any, str]:
    """The registry or layout and the name inside it that REF gives."""
    ref, name = check_ref(args, push=push)
    if ref is None:
        from .layout import Layout

        return Layout(args.layout, create=push), name
    from .registry import Registry

    return Registry(ref, plain_http=args.plain_http, push=push, timeout_s=args.timeout,
                    read_timeout_s=args.read_timeout), name


def time_limits(target: Any) -> AbstractContextManager[Any]:
    """A registry's deadline, its timer stopped when the command ends; a layout has none."""
    return getattr(target, "deadline", None) or nullcontext()


def run_push(store: Any, args: argparse.Namespace) -> tuple[Any, str, int]:
    from .image import push

    options = signing_options(args)
    target, name = target_of(args, push=True)
    with time_limits(target):
        r = push(store, target, name, archs=args.arch, **options)
    text = (f"pushed {args.ref} to {target.describe()}: {r['digest']} ({r['compile_entries']} compile entries, "
            f"{r['tuning_records']} tuning records, archs {r['labels']['cache.ctbuild.image/archs']})"
            + (f", signed ({r['signature']})" if r["signature"] else ""))
    if left_out := left_out_line(r):  # pushed what is intact, but not the whole cache: exit 1, as export
        text += f"\n{left_out}"
    return r, text, 1 if left_out else 0


def run_pull(cache: Path, args: argparse.Namespace) -> tuple[Any, str, int]:
    from .image import pull

    if args.require_signature != (args.key is not None):
        raise CacheError("--require-signature and --key PUB.pem go together: give both to verify, neither to skip")
    if args.min_sequence is not None and not args.require_signature:
        raise CacheError("--min-sequence needs --require-signature --key PUB.pem")
    arch = _arch(args)
    key = load_key(args.key) if args.key else None
    if key is not None and key.algorithm != "ed25519":
        raise CacheError(f"{args.key} is an HMAC secret; images are verified with an Ed25519 public key")
    target, name = target_of(args, push=False)
    with time_limits(target):
        r = pull(target, name, cache, arch=arch, key=key, min_sequence=args.min_sequence,
                 import_options={"limits": ImportLimits(member_size=args.max_member_size)})
    text = (f"pulled {args.ref} ({r['digest']}) for {arch}{' (signature verified)' if r['signed'] else ''} into "
            f"{cache}: {r['blobs_added']} new CUBINs, {r['entries_written']} entries written, "
            f"{r['entries_unchanged']} already present")
    return r, text, 0


def _arch(args: argparse.Namespace) -> str:
    """This GPU's arch (the ctbuild CLI detects it), else --arch; exact sm, never a guess."""
    local = getattr(args, "local_arch", None)
    if local and args.arch and args.arch != local:
        raise CacheError(f"this machine's GPU is {local}, but --arch says {args.arch}: drop --arch on a GPU node")
    arch = local or args.arch
    if not arch:
        raise CacheError("no GPU is visible to check the image's arch against: pass --arch, e.g. --arch sm_90")
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise CacheError(f"invalid --arch {arch!r}: expected sm_XY, e.g. sm_90")
    return arch


def run_keygen(args: argparse.Namespace) -> tuple[Any, str, int]:
    key_id = keygen(args.private, args.public, force=args.force)
    return ({"private": str(args.private), "public": str(args.public), "key_id": key_id},
            f"wrote {args.private} (private: keep it secret, out of images) and {args.public} (public); "
            f"key id {key_id}", 0)
