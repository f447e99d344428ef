"""Many real processes on one cache: concurrent writers and readers, and writers killed by SIGKILL."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from ctbuild.cache import Store

REPO = Path(__file__).resolve().parents[2]

# Shared by workers and the test: the bytes a key must hold, whoever wrote it.
PAYLOAD = '''
import hashlib
def payload(key, lo, hi):
    seed = hashlib.sha256(key.encode()).digest()
    size = lo + int.from_bytes(seed[:4], "little") % (hi - lo)
    return (seed * (size // 32 + 1))[:size]
def key_of(wid, j):
    return f"shared-{(j // 3) % 60}" if j % 3 == 0 else f"w{wid}-{j}"
'''

WRITER = PAYLOAD + '''
import sys
from ctbuild.cache import Store
path, wid, count, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
store = Store(path)
print("ready", flush=True)
j = 0
while count < 0 or j < count:
    key = key_of(wid, j)
    store.put_compile(key, payload(key, lo, hi), symbol=f"sym_{key}",
                      meta={"kernel": f"k{wid % 3}", "arch": "sm_90", "writer": wid})
    if j % 10 == 0:
        store.put_tuning(f"t-{key}", {"kernel": f"k{wid % 3}", "arch": "sm_90", "compile_key": key})
    j += 1
'''

READER = PAYLOAD + '''
import json, os, random, sys
from ctbuild.cache import Store
path, stop = sys.argv[1], sys.argv[2]
store = Store(path)
keys = sorted({key_of(w, j) for w in range(8) for j in range(300)})
hits = torn = lookups = 0
while not os.path.exists(stop):
    for key in random.sample(keys, 50):
        lookups += 1
        present = store.has_compile(key)
        hit = store.get_compile(key)
        if hit is None:
            torn += present  # nothing is ever deleted here: an entry once visible must stay whole
            continue
        hits += 1
        torn += hit.cubin != payload(key, 1024, 4096) or hit.symbol != f"sym_{key}" or hit.meta["digest"] is None
print(json.dumps({"hits": hits, "torn": torn, "lookups": lookups, "failures": store.stats()["digest_failures"]}))
'''

ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
namespace: dict = {}
exec(PAYLOAD, namespace)
payload, key_of = namespace["payload"], namespace["key_of"]


def spawn(code: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eight_writers_two_readers_nothing_lost_or_torn(tmp_path):
    path, stop = tmp_path / "cache", tmp_path / "stop"
    readers = [spawn(READER, path, stop) for _ in range(2)]
    writers = [spawn(WRITER, path, wid, 300, 1024, 4096) for wid in range(8)]
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    stop.touch()
    reports = []
    for r in readers:
        out, err = r.communicate(timeout=60)
        assert r.returncode == 0, err
        reports.append(json.loads(out))
    assert all(rep["torn"] == 0 and rep["failures"] == 0 for rep in reports), reports
    assert sum(rep["hits"] for rep in reports) > 0, reports

    store = Store(path)
    expected = {key_of(w, j) for w in range(8) for j in range(300)}
    entries = dict(store.compile_entries())
    assert set(entries) == expected  # 0 lost
    for key in expected:
        hit = store.get_compile(key)
        assert hit is not None and hit.cubin == payload(key, 1024, 4096) and hit.symbol == f"sym_{key}"
    assert dict(store.tuning_records()).keys() == {f"t-{key_of(w, j)}" for w in range(8) for j in range(0, 300, 10)}
    assert store.stats()["digest_failures"] == 0
    assert store.verify()["ok"]


def test_writers_killed_mid_store_leave_only_whole_entries(tmp_path):
    path = tmp_path / "cache"
    rng = random.Random(1234)
    crashes = []
    for batch in range(5):  # 30 writers, 6 at a time
        writers = [spawn(WRITER, path, batch * 6 + i, -1, 16_000, 64_000) for i in range(6)]
        for w in writers:
            assert w.stdout.readline().strip() == "ready", w.stderr.read()
        for w in writers:
            time.sleep(rng.uniform(0.0, 0.15))
            w.send_signal(signal.SIGKILL)
        for w in writers:
            w.wait(timeout=30)
            if w.returncode != -signal.SIGKILL:
                crashes.append(w.stderr.read())
            w.stdout.close()
            w.stderr.close()
    assert crashes == []  # every writer was still writing when killed

    store = Store(path)
    entries = dict(store.compile_entries())
    assert len(entries) > 30  # writers did get work in before dying
    for key in entries:
        hit = store.get_compile(key)
        assert hit is not None and hit.cubin == payload(key, 16_000, 64_000), key
    for key, record in store.tuning_records():
        assert store.has_compile(record["compile_key"]), key  # records are written after their winner
    assert store.verify()["ok"]
    store.gc(orphan_grace_s=0)  # orphan blobs and files of interrupted writes go
    assert store.verify()["ok"]
    files = list((path / "blobs").glob("??/??/*.val"))
    assert len(files) == store.stats()["blobs"]
    assert store.stats()["digest_failures"] == 0
