"""Two builds into one cache at once compile each key once between them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, SMALL  # noqa: E402

from ctbuild.farm import Farm  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "farm_project"
pytestmark = pytest.mark.slow


def test_a_key_claimed_by_another_build_is_waited_for_not_compiled(tmp_path):
    """A live process holds the claim on one key: this build compiles the rest, then waits;
    when the holder stores that key and exits, the key counts as cached here."""
    cache = tmp_path / "c"
    jobs = [{"key": f"k{i}", "payload": f"p{i}"} for i in range(4)]
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from ctbuild.farm.claims import Claims; from ctbuild.cache import Store\n"
         f"c = Claims({str(cache)!r}) if Store({str(cache)!r}, readonly=False) else None\n"
         "assert c.claim('k2'); print('held', flush=True); time.sleep(4)\n"
         f"Store({str(cache)!r}, readonly=False).put_compile('k2', b'theirs', symbol='s', "
         "meta={})\n"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with Farm(cache, "farm_fixture_fns:echo_compile", workers=1,
                  sys_paths=[str(FIXTURE)]) as farm:
            result = farm.run(jobs)
    finally:
        holder.wait(timeout=60)
    status = {r.key: r.status for r in result.records}
    assert status == {"k0": "compiled", "k1": "compiled", "k2": "cached", "k3": "compiled"}
    from ctbuild.cache import Store
    with Store(cache) as store:
        assert store.get_compile("k2").cubin == b"theirs"


def test_two_precompiles_at_once_do_not_duplicate_work(tmp_path):
    cache = tmp_path / "c"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "ctbuild", "precompile", "--config", str(SMALL), "--cache",
            str(cache), "--workers", "1", "--json"]
    procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=400) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [json.loads(o[0]) for o in outs]
    assert sum(r["compiled"] for r in results) == 6, results  # each key compiled once
    assert all(r["compiled"] + r["cached"] == 6 and r["failed"] == 0 for r in results)
