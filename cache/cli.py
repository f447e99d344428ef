"""The ``ctbuild cache`` subcommands: stats, ls, verify, gc, rm, export, import, and push, pull,
keygen (the cache as an OCI image: :mod:`ctbuild.cache.oci`).

The main ``ctbuild`` CLI calls :func:`add_cache_parser` to register them and
:func:`run_cache_command` to run them; ``python -m ctbuild.cache`` does the same
with a parser of its own.
Exit codes: 0 done, 1 ``verify`` found problems, ``rm`` matched nothing or ``export`` or ``push``
left entries out, 2 bad input or an unusable cache (the message says what and what to do).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from .bundle import DEFAULT_LIMITS, read_key
from .bundle_export import left_out_line
from .bundle_limits import ImportLimits
from .errors import CacheError
from .layout import LAYOUT_FILE, is_writable
from .oci import commands as oci
from .store import Store

DEFAULT_CACHE_DIR = "./.ctbuild-cache"
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)

EPILOG = """\
The cache directory is --cache, else $CTBUILD_CACHE_DIR, else the project config, else ./.ctbuild-cache.
Every command takes --json for machine-readable output.

examples:
  ctbuild cache stats                          counts and bytes
  ctbuild cache ls --kernel matmul             entries of one kernel
  ctbuild cache verify                         re-hash every blob; exit 1 if anything is wrong
  ctbuild cache verify --repair                ... rebuild a damaged index, drop what is broken; precompile rebuilds it
  ctbuild cache gc --size-limit 2G             drop orphans, evict least-recently-used CUBINs to 2 GiB
  ctbuild cache rm matmul                      forget one kernel (then gc reclaims its blobs)
  ctbuild cache export --arch sm_90 h200.tgz   ship the sm_90 part of the cache
  ctbuild cache import h200.tgz                merge a bundle (verified first; idempotent)
  ctbuild cache export --sign ci.pem k.tgz     ... signed (Ed25519 private key, or an HMAC secret file)
  ctbuild cache import --require-signature ci.pub.pem k.tgz   accept only bundles signed with that key
  ctbuild cache keygen ci.pem ci.pub.pem       an Ed25519 key pair for signing
  ctbuild cache push localhost:5000/kernels:v1   the cache as a one-layer OCI image (--sign KEY to sign it)
  ctbuild cache pull localhost:5000/kernels:v1   check (--require-signature --key PUB.pem) and import an image
"""

#: Commands that only read: they open the cache read-only, so they never write into a directory.
READ_ONLY = ("stats", "ls", "export", "push")
#: Commands that open no cache first: pull creates one only once everything checked out.
STORELESS = ("pull", "keygen")


def parse_size(text: str) -> int:
    """Bytes from '2G', '512M', '1.5GiB', '1048576' (binary units: K = 1024)."""
    match = SIZE_RE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use bytes or a number with K, M, G or T (e.g. 2G, 512M)")
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


def parse_count(text: str) -> int:
    """A whole number >= 1 (``--max-members``)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: give a whole number >= 1")
    return int(text)


def parse_archs(text: str) -> list[str]:
    archs = [arch.strip() for arch in text.split(",")]
    if not all(archs):
        raise argparse.ArgumentTypeError(
            f"invalid --arch {text!r}: give comma-separated archs with none empty, e.g. sm_90,sm_100")
    if bad := [a for a in archs if not re.fullmatch(r"sm_\d{2,3}", a)]:  # else an empty bundle (or table)
        digits = re.sub(r"\D", "", bad[0])
        hint = f"did you mean 'sm_{digits}'?" if len(digits) in (2, 3) else "e.g. sm_90"
        raise argparse.ArgumentTypeError(f"invalid --arch {bad[0]!r}: archs are spelt sm_XY ({hint})")
    return archs


def parse_arch(text: str) -> str:
    """One arch (``ls --arch``), checked as `parse_archs` checks each: a misspelt one would
    match no entry and list an empty table."""
    archs = parse_archs(text)
    if len(archs) != 1:
        raise argparse.ArgumentTypeError(f"invalid --arch {text!r}: give one arch, e.g. sm_90")
    return archs[0]


#: Keeps the line breaks of an epilog or description as written.
_RAW = argparse.RawDescriptionHelpFormatter


def add_cache_parser(subparsers: Any, prog: str | None = None) -> None:
    """Add ``cache`` and its subcommands to an argparse subparsers object; ``prog`` names the
    command in usage lines where it is not the parent's prog + ``cache``."""
    common = _common_options()
    named = {"prog": prog} if prog else {}
    cache = subparsers.add_parser("cache", help="inspect and maintain the kernel cache", epilog=EPILOG,
                                  formatter_class=_RAW, **named,
                                  description="Inspect and maintain the content-addressed kernel cache "
                                              "(CUBINs, compile entries, tuning records).")
    sub = cache.add_subparsers(dest="cache_command", metavar="COMMAND", required=True)
    _add_inspection_parsers(sub, common)
    _add_removal_parsers(sub, common)
    _add_export_parser(sub, common)
    _add_import_parser(sub, common)
    oci.add_parsers(sub, common, parse_archs, parse_size, DEFAULT_LIMITS.member_size)


def _common_options() -> argparse.ArgumentParser:
    """The options every subcommand takes (--cache, --json), as a parent parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache", dest="cache_dir", metavar="DIR",
                        help="cache directory (default: $CTBUILD_CACHE_DIR, the project config, ./.ctbuild-cache)")
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    return common


def _add_inspection_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """stats, ls and verify: the commands that look at the cache (only verify --repair changes it)."""
    sub.add_parser("stats", parents=[common], help="counts, bytes and a quick index check",
                   description="Counts of blobs, compile entries, tuning records and toolchains, and blob bytes; "
                               "checks every index with SQLite's quick_check (no CUBIN is read). Exit 1 if an index "
                               "is damaged (`ctbuild cache verify --repair` rebuilds it). Read-only: writes nothing.")

    ls = sub.add_parser("ls", parents=[common], help="list compile entries and tuning records",
                        description="List compile entries (kernel, arch, signature class, key prefix, CUBIN size, "
                                    "config, symbol) and "
                                    "tuning records (kernel, arch, key prefix, winner's config and compile "
                                    "key prefix).")
    ls.add_argument("--kernel", help="only this kernel")
    ls.add_argument("--arch", type=parse_arch, help="only this arch, e.g. sm_90")

    verify = sub.add_parser("verify", parents=[common], help="check every index, blob and entry (exit 1 on problems)",
                            description="Check every index (SQLite integrity), re-hash every blob, check every compile "
                                        "entry has a valid blob and every tuning record's winner exists. Exit 1 if "
                                        "anything is wrong.")
    verify.add_argument("--repair", action="store_true",
                        help="rebuild a damaged index from what is still readable (the damaged file is kept in "
                             "quarantine/), remove broken entries and quarantine corrupt blobs, so the next precompile "
                             "rebuilds what was lost; run it while nothing else writes the cache")


def _add_removal_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """gc and rm: the commands that drop entries and reclaim space."""
    gc = sub.add_parser("gc", parents=[common], help="drop orphans; evict least-recently-used entries to a size",
                        epilog="example: ctbuild cache gc --size-limit 2G", formatter_class=_RAW,
                        description="Remove blobs no entry uses and files of interrupted writes, then (with a size "
                                    "limit) evict least-recently-used compile entries and their CUBINs until blob "
                                    "bytes fit. Tuned winners are kept unless --evict-tuned.")
    gc.add_argument("--size-limit", type=parse_size, metavar="SIZE",
                    help="target blob bytes, e.g. 2G, 500M (K/M/G/T = 1024^n)")
    gc.add_argument("--evict-tuned", action="store_true",
                    help="also evict tuned winners (last), dropping the tuning records that name them")
    gc.add_argument("--orphan-grace", type=float, default=600.0, metavar="SECONDS",
                    help="keep orphans younger than this: they may belong to a write in progress (default 600)")

    rm = sub.add_parser("rm", parents=[common], help="drop one kernel's entries",
                        epilog="example: ctbuild cache rm matmul --key 3f2a...", formatter_class=_RAW,
                        description="Drop the compile entries and tuning records of KERNEL (or just the entry KEY). "
                                    "Their CUBINs are reclaimed by the next `ctbuild cache gc`. Exit 1 if "
                                    "nothing matched.")
    rm.add_argument("kernel", metavar="KERNEL", help="kernel name, as in `ctbuild cache ls`")
    rm.add_argument("--key", help="only this compile or tuning key (full key, see `ctbuild cache ls --json`)")


def _add_export_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """export: part or all of the cache written to a bundle, optionally signed."""
    export = sub.add_parser("export", parents=[common], help="write entries and CUBINs to a bundle file",
                            epilog="example: ctbuild cache export --arch sm_90,sm_100 kernels.tgz",
                            formatter_class=_RAW,
                            description="Write compile entries, tuning records, toolchain profiles and the CUBINs they "
                                        "need to a tar bundle (.tar, .tar.gz/.tgz or .tar.xz by suffix).")
    export.add_argument("file", metavar="FILE", type=Path, help="bundle to write (replaced atomically)")
    export.add_argument("--arch", type=parse_archs, metavar="ARCHS",
                        help="only these archs, comma-separated: sm_90,sm_100")
    oci.add_signing_args(export, "sign the bundle with KEYFILE: an Ed25519 private key (`ctbuild cache keygen`), or "
                                 "a secret of >= 32 bytes for HMAC-SHA256 (e.g. `head -c 48 /dev/urandom | base64 > "
                                 "KEYFILE`); keep it out of images and logs")


def _add_import_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """import: a bundle checked (shape, digests, size limits, optionally its signature), then merged."""
    imp = sub.add_parser("import", parents=[common], help="merge a bundle into the cache", formatter_class=_RAW,
                         description="Check a bundle, then merge it; importing twice changes nothing.",
                         epilog="What an import checks: safe member paths and types, the format version, JSON shapes, "
                                "every CUBIN's digest,\nthat every CUBIN is used by an entry and every tuning record's "
                                "winner exists, and the limits above\n(checked from the tar headers, against the free "
                                "space and inodes too). A bundle failing a check is refused\nwith nothing written. "
                                "Digests detect "
                                "damage, not intent: an unsigned bundle is trusted to be what its maker\nsays (anyone "
                                "able to write it can map a kernel's keys to any CUBIN). With "
                                "--require-signature only\n"
                                "bundles exported with --sign and the same key, unchanged since, are accepted.")
    imp.add_argument("file", metavar="FILE", type=Path,
                     help="bundle made by `ctbuild cache export`, or a directory holding one unpacked (a mounted "
                          "cache image)")
    imp.add_argument("--require-signature", type=Path, metavar="KEYFILE",
                     help="refuse the bundle unless it was signed (`export --sign`) with KEYFILE's key: the Ed25519 "
                          "public key, or the same HMAC secret")
    imp.add_argument("--min-sequence", type=int, metavar="N",
                     help="with --require-signature: refuse a bundle signed with a sequence below N (an older release)")
    limits = DEFAULT_LIMITS
    imp.add_argument("--max-member-size", type=parse_size, default=limits.member_size, metavar="SIZE",
                     help=f"refuse bundles with a member larger than this (default {limits.member_size // 2**20}M; "
                          "real CUBINs are far smaller)")
    imp.add_argument("--max-members", type=parse_count, default=limits.members, metavar="N",
                     help=f"refuse bundles of more members than this (default {limits.members})")
    imp.add_argument("--max-size", type=parse_size, default=limits.size, metavar="SIZE",
                     help=f"refuse bundles that would take more disk than this, a block per file and "
                          f"index rows included (default {limits.size // 2**30}G; the free space is always checked)")
    imp.add_argument("--max-json-size", type=parse_size, default=limits.json_size, metavar="SIZE",
                     help=f"refuse bundles whose JSON documents together are larger, or hold more than one value "
                          f"per 16 bytes of it (default {limits.json_size // 2**20}M, about 30,000 compile entries; "
                          "an import takes up to about 8 times this in memory)")


def cache_dir(args: argparse.Namespace) -> tuple[Path, str]:
    """(the cache directory, why): --cache > $CTBUILD_CACHE_DIR > ./.ctbuild-cache. ``ctbuild cache``
    passes the directory ctbuild chose (with the project config) as --cache, and why as ``args.cache_from``."""
    if args.cache_dir:
        return Path(args.cache_dir), getattr(args, "cache_from", None) or "--cache"
    if os.environ.get("CTBUILD_CACHE_DIR"):
        return Path(os.environ["CTBUILD_CACHE_DIR"]), "CTBUILD_CACHE_DIR"
    return Path(DEFAULT_CACHE_DIR), "the default"


def run_cache_command(args: argparse.Namespace) -> int:
    """Run the parsed ``cache`` subcommand; returns the exit code."""
    command = args.cache_command
    path, args.cache_from = cache_dir(args)
    readonly = command in READ_ONLY or (command == "verify" and not args.repair)
    before = _what_is_there(path) if command == "import" else None
    try:
        if (check := getattr(args, "check", None)) is not None:  # what the command line alone tells
            check(args)
        if command in STORELESS:
            result, text, code = oci.run_pull(path, args) if command == "pull" else oci.run_keygen(args)
            print(json.dumps(result, indent=2, sort_keys=True) if args.json else text)
            return code
        if command != "import" and not path.is_dir():
            raise CacheError(f"no cache at {path} ({args.cache_from}): pass --cache DIR or set CTBUILD_CACHE_DIR")
        if command != "import" and not _looks_like_cache(path):
            raise CacheError(f"{path} is not a ctbuild cache (no {LAYOUT_FILE}, blobs/ or compile/): "
                             "pass --cache DIR or set CTBUILD_CACHE_DIR")
        with Store(path, readonly=True if readonly else None) as store:
            result, text, code = COMMANDS[command](store, args)
    except (CacheError, OSError) as exc:
        if before is not None:
            _remove_new(path, before)
        message = str(exc) if isinstance(exc, CacheError) else f"{exc.strerror or exc}: {exc.filename or path}"
        if args.json:
            print(json.dumps({"error": message}))
        print(f"ctbuild cache {command}: error: {message}", file=sys.stderr)
        return 2 if isinstance(exc, CacheError) else 1
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else text)
    return code


def _what_is_there(path: Path) -> tuple[Path | None, set[str]] | None:
    """Before an import where no cache is yet: (the topmost of the directories the import would
    create, or None where it exists; what it holds). None where a cache is (a refused import
    writes nothing into a cache)."""
    if not path.exists():
        top = path.absolute()
        while not top.parent.exists():
            top = top.parent
        return top, set()
    if not path.is_dir() or (path / LAYOUT_FILE).exists():
        return None
    return None, set(os.listdir(path))


def _remove_new(path: Path, before: tuple[Path | None, set[str]]) -> None:
    """After a refused import, remove the empty cache that opening the store created (and the
    directories it made): "nothing was imported" leaves nothing."""
    import shutil
    created, names = before
    try:
        if created is not None:
            shutil.rmtree(created)
            return
        for name in set(os.listdir(path)) - names:
            target = path / name
            shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    except OSError:  # what cannot be removed stays: the import's own error is what to report
        pass


def _looks_like_cache(path: Path) -> bool:
    return any((path / name).exists() for name in (LAYOUT_FILE, "blobs", "compile"))


def _stats(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    s = store.stats()
    limit = "none" if s["size_limit"] is None else _size(s["size_limit"])
    damaged = [f"{name} index: {detail.splitlines()[-1]}" for name, detail in s["damaged"].items()]
    health = ("DAMAGED (" + "; ".join(damaged) + f"); repair: {store.repair_hint()}") if damaged else "ok (quick_check)"
    s["cache_from"] = args.cache_from
    s["writable"] = is_writable(store.path)
    s["readonly"] = not s["writable"]  # the cache's, not this read-only handle's
    text = "\n".join([
        f"cache        {s['path']} ({args.cache_from}), "
        f"{'writable' if s['writable'] else 'read-only (this process cannot write it)'}",
        f"blobs        {s['blobs']} ({_size(s['bytes'])})",
        f"compile      {s['compile_entries']} entries",
        f"tuning       {s['tuning_records']} records",
        f"toolchains   {s['toolchains']}",
        f"size limit   {limit}",
        f"integrity    {health}",
    ])
    return s, text, 1 if damaged else 0


def _ls(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    def wanted(entry: dict[str, Any]) -> bool:
        return ((args.kernel is None or entry.get("kernel") == args.kernel)
                and (args.arch is None or entry.get("arch") == args.arch))

    # "class": the signature class the writer recorded (exact, relaxed, generic); none recorded is exact
    compiles: list[dict[str, Any]] = [
        {"key": k, "class": e.get("class") or "exact",
         **{f: e.get(f) for f in ("kernel", "arch", "size", "config", "symbol", "digest", "created")}}
        for k, e in store.compile_entries() if wanted(e)]
    tunings: list[dict[str, Any]] = [
        {"key": k, **{f: r.get(f) for f in ("kernel", "arch", "config", "compile_key", "created")}}
        for k, r in store.tuning_records() if wanted(r)]
    rows = [("KIND", "KERNEL", "ARCH", "CLASS", "KEY", "SIZE", "CONFIG", "SYMBOL / WINNER")]
    rows += [("compile", str(c["kernel"]), str(c["arch"]), str(c["class"]), c["key"][:16], _size(c["size"] or 0),
              _config(c["config"]), str(c["symbol"])) for c in compiles]
    rows += [("tuning", str(t["kernel"]), str(t["arch"]), "-", t["key"][:16], "", _config(t["config"]),
              t["compile_key"][:16]) for t in tunings]
    widths = [max(len(row[i]) for row in rows) for i in range(7)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[7] for row in rows]
    lines.append(f"{len(compiles)} compile entries, {len(tunings)} tuning records")
    return {"compile": compiles, "tuning": tunings}, "\n".join(lines), 0


def _config(config: Any) -> str:
    """A config as compact ``name=value`` pairs (entries differing only in a hint must look different)."""
    if not isinstance(config, dict):
        return "-" if config is None else json.dumps(config)
    return ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(config.items())) or "{}"


def _verify(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    result = store.verify(repair=args.repair)
    checked = ", ".join(f"{n} {what}" for what, n in result["checked"].items())
    lines = [f"checked {checked}"]
    lines += [f"  {p['kind']}: {p['namespace']} {p['key']}: {' / '.join(p['detail'].splitlines())}"
              for p in result["problems"]]
    lines += [f"  rebuilt the {name} index: kept {r['kept']} entries"
              + (f", {r['lost_rows']} unusable rows dropped" if r["lost_rows"] else "")
              + "; what it could not use is in quarantine/" for name, r in result.get("rebuilt", {}).items()]
    left = [p for p in result["problems"] if p["kind"] in ("permission_denied", "unreadable_file")]
    if left:  # no repair removes these: say what would fix them instead
        lines.append(f"{len(left)} path(s) could not be read and are left as they are: "
                     + ("a permission problem, not damage: fix ownership or modes (the paths above), or run as "
                        "the cache's owner" if left[0]["kind"] == "permission_denied" else "check the disk"))
    fixable = len(result["problems"]) - len(left)
    if result["ok"]:
        lines.append("ok")
    elif args.repair:
        lines.append(f"{len(result['problems'])} problem(s); repaired {result['repaired']}"
                     + (": re-run precompile to rebuild" if result["repaired"] else ""))
    elif fixable:
        lines.append(f"{fixable} problem(s): `ctbuild cache verify --repair` removes them")
    return result, "\n".join(lines), 0 if result["ok"] else 1


def _gc(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    r = store.gc(size_limit=args.size_limit, evict_tuned=args.evict_tuned, orphan_grace_s=args.orphan_grace)
    text = (f"removed {r['orphan_blobs_removed']} orphan blobs, {r['stray_files_removed']} stray files; "
            f"evicted {r['evicted_entries']} entries ({r['evicted_blobs']} blobs, "
            f"{r['dropped_tuning_records']} tuning records); "
            f"{_size(r['bytes_before'])} -> {_size(r['bytes_after'])}")
    if not r["limit_met"]:
        text += (f"\nstill above the limit {_size(r['size_limit'])}: the rest are tuned winners "
                 "(--evict-tuned evicts them too)")
    return r, text, 0


def _rm(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    removed = store.remove_kernel(args.kernel, args.key)
    what = f"kernel {args.kernel!r}" + (f" key {args.key!r}" if args.key else "")
    if not removed:
        return {"removed": 0}, f"nothing matched {what} (see `ctbuild cache ls`)", 1
    return {"removed": removed}, f"removed {removed} entries of {what}; `ctbuild cache gc` reclaims their CUBINs", 0


def _export(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    options = oci.signing_options(args)
    r = store.export_bundle(args.file, archs=args.arch, sign_key=options["key"], sequence=options["sequence"],
                            expires=options["expires"])
    text = (f"wrote {args.file}: {r['compile_entries']} compile entries, {r['tuning_records']} tuning records, "
            f"{r['toolchains']} toolchains, {r['blobs']} CUBINs ({_size(r['bytes'])})"
            f"{', signed' if r['signed'] else ''}")
    if left_out := left_out_line(r):  # a whole bundle of what is intact, but not the whole cache: exit 1
        text += f"\n{left_out}"
    return r, text, 1 if left_out else 0


def _import(store: Store, args: argparse.Namespace) -> tuple[Any, str, int]:
    key = read_key(args.require_signature) if args.require_signature else None
    if args.min_sequence is not None and key is None:
        raise CacheError("--min-sequence needs --require-signature KEYFILE")
    limits = ImportLimits(member_size=args.max_member_size, members=args.max_members, size=args.max_size,
                          json_size=args.max_json_size)
    options = {"require_key": key, "limits": limits, "min_sequence": args.min_sequence}
    if args.file.is_dir():  # an unpacked bundle: an image volume, GKM's extraction of a pushed image
        from .bundle_tree import import_tree
        r = import_tree(store, args.file, **options)
    else:
        r = store.import_bundle(args.file, **options)
    text = (f"imported {args.file}{' (signature verified)' if r['signed'] else ''}: {r['blobs_added']} new CUBINs, "
            f"{r['entries_written']} entries written, {r['entries_unchanged']} already present")
    return r, text, 0


COMMANDS = {"stats": _stats, "ls": _ls, "verify": _verify, "gc": _gc, "rm": _rm, "export": _export, "import": _import,
            "push": oci.run_push}


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
