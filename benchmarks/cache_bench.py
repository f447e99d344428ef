"""Throughput of the kernel cache on local disk: put_compile, get_compile (hot), has_compile.

    python benchmarks/cache_bench.py [--entries 10000] [--min-kb 16] [--max-kb 64] [--dir DIR]

Blobs are random bytes (incompressible, like the bulk of a CUBIN) of 16-64 KB. "Hot" lookups run
after one warm-up pass, so the files are in the page cache: this measures the cache's own cost
(SQLite lookup, file read, xxh3 re-hash, access-time update), not the disk. get_compile is also
timed on a read-only store, which skips the access-time update.
"""

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ctbuild.cache import Store  # noqa: E402  (after the path tweak, so the benchmark runs from a checkout)


def rate(label: str, count: int, seconds: float, nbytes: int = 0) -> None:
    extra = f"  {nbytes / seconds / 2**20:8.1f} MiB/s" if nbytes else ""
    print(f"{label:<34} {count / seconds:>10,.0f} /s  ({count} in {seconds:.2f} s){extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--min-kb", type=int, default=16)
    parser.add_argument("--max-kb", type=int, default=64)
    parser.add_argument("--dir", type=Path, help="parent of the temp cache dir (default: system temp)")
    args = parser.parse_args()

    rng = random.Random(0)
    blobs = [rng.randbytes(rng.randint(args.min_kb * 1024, args.max_kb * 1024)) for _ in range(args.entries)]
    keys = [f"{i:08d}-{rng.getrandbits(128):032x}" for i in range(args.entries)]
    total = sum(map(len, blobs))
    meta = {"kernel": "matmul", "kernel_fp": "f" * 32, "arch": "sm_90", "toolchain": "t" * 32,
            "compile_seconds": 0.3, "config": {"tile_m": 128, "tile_n": 128, "num_stages": 3},
            "workload": "m4096n4096k4096"}

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = Store(Path(tmp) / "cache")
        print(f"{args.entries} entries, {total / 2**20:.0f} MiB of {args.min_kb}-{args.max_kb} KB blobs in {tmp}")
        start = time.perf_counter()
        for key, blob in zip(keys, blobs):
            store.put_compile(key, blob, symbol="matmul_kernel", meta=meta)
        rate("put_compile (stores)", args.entries, time.perf_counter() - start, total)

        order = keys[:]
        rng.shuffle(order)
        for key in order:  # warm-up: page cache and SQLite cache
            store.get_compile(key)
        start = time.perf_counter()
        hits = sum(store.get_compile(key) is not None for key in order)
        rate("get_compile hot (lookups)", hits, time.perf_counter() - start, total)
        assert hits == args.entries

        start = time.perf_counter()
        found = sum(map(store.has_compile, order))
        rate("has_compile", found, time.perf_counter() - start)
        assert found == args.entries
        store.close()

        readonly = Store(Path(tmp) / "cache", readonly=True)
        start = time.perf_counter()
        hits = sum(readonly.get_compile(key) is not None for key in order)
        rate("get_compile hot, read-only store", hits, time.perf_counter() - start, total)
        readonly.close()


if __name__ == "__main__":
    main()
