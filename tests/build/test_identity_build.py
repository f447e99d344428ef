"""Kernel identity through real builds: path-independent CUBINs, toolkit env vars stripped,
the identity check, and declaration edits that keep every CUBIN and tuning record."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, explain, precompile  # noqa: E402

from ctbuild.cache import Store  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "identity_project"
WORKLOAD = '{"X": Tensor((1024,), "float32"), "OUT": Tensor((1024,), "float32")}'
FP16 = WORKLOAD.replace("float32", "float16")

#: Run inside a project: record a winner for idk's workload 0 (as `ctbuild tune` would),
#: resolve a call of it on the CPU as the runtime does, or miss add_eps with an eps no build saw.
RUNTIME = r'''
import json, sys
import torch
sys.path.insert(0, sys.argv[2])
from ctbuild.cache import Store
from ctbuild.project import load_project
from ctbuild.keys import kernel_record_key
from ctbuild.compile.plan import job_for
from ctbuild.serve.kernel_runtime import CacheMissError
from ctbuild.space import Config
kernels = {k.name: k for k in load_project(sys.argv[2] + "/ctbuild.toml").kernels()}
tc = next(iter(Store(sys.argv[3]).toolchains()))
idk, add_eps = kernels["idk"], kernels["add_eps"]
w = idk.workloads[0]
x = torch.zeros(1024)
if sys.argv[1] == "record":
    cfg = Config({"TILE": 128}, idk.name)
    Store(sys.argv[3]).put_tuning(kernel_record_key(idk, w, "sm_90", "H200", tc), {
        "kernel": idk.name, "arch": "sm_90", "compile_key": job_for(idk, cfg, w, "sm_90", tc).key,
        "config": cfg.to_json()})
elif sys.argv[1] == "resolve":
    res = idk.runtime.resolve((x, x.clone()), arch="sm_90", gpu="H200")
    print(json.dumps({"config": res.config.to_json(), "config_from": res.config_from,
                      "cubin_from": res.cubin_from}))
elif sys.argv[1] == "verify":  # which class serves TILE=64 and 128, checked and not
    from ctbuild.serve.context import context
    from ctbuild.signature import derive_signature
    src, got = context().source, {}
    for check in (True, False):
        src.verify, saved = (src.verify if check else None), src.verify
        for tile in (64, 128):
            cfg = Config({"TILE": tile}, idk.name)
            sig = derive_signature(idk.kernel, idk.kernel_args(cfg, w))
            found = src.lookup_class(idk, cfg, sig, "sm_90")
            got[f"{tile} {'checked' if check else 'plain'}"] = found and found[2]
        src.verify = saved
    print(json.dumps(got))
else:
    y = torch.zeros(64, 256)
    try:
        add_eps.runtime.resolve((y, y.clone(), 1e-6), arch="sm_90", gpu="H200")
    except CacheMissError:
        print("miss")
'''


def _copy(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest / "ctbuild.toml"


def _build(config: Path, cache: Path, env: dict | None = None) -> dict:
    proc, _, out = precompile("--config", str(config), "--cache", str(cache), "--json",
                              "--workers", "1", env=env)
    assert proc.returncode == 0, explain(proc)
    return out


def _entries(cache: Path) -> dict[str, dict]:
    with Store(cache) as store:
        return dict(store.compile_entries())


def _verify_identity(config: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ctbuild", "cache", "verify", "--identity",
                           "--config", str(config), "--cache", str(cache), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def _runtime(action: str, project: Path, cache: Path, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", RUNTIME, action, str(project), str(cache)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "CTBUILD_CACHE_DIR": str(cache),
                               "CTBUILD_MODE": "strict", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The fixture built from two checkout paths, one of them with a bogus CUDA_ROOT."""
    tmp = tmp_path_factory.mktemp("builds")
    a, b = _copy(tmp / "src"), _copy(tmp / "build" / "a" / "much" / "longer" / "path")
    with ThreadPoolExecutor(max_workers=1) as pool:  # two one-worker builds at once
        first = pool.submit(_build, a, tmp / "cache-a",
                            env={"CUDA_ROOT": "/nonexistent", "CUDA_PATH": "/x"})
        out_b = _build(b, tmp / "cache-b")
        out_a = first.result()
    return {"a": (a, tmp / "cache-a", out_a), "b": (b, tmp / "cache-b", out_b)}


def test_two_checkout_paths_give_byte_identical_cubins(two_builds: dict) -> None:
    (_, cache_a, out_a), (_, cache_b, out_b) = two_builds["a"], two_builds["b"]
    assert out_a["compiled"] == out_b["compiled"] == out_a["jobs"] >= 2
    ea, eb = _entries(cache_a), _entries(cache_b)
    assert ea.keys() == eb.keys()
    for key in ea:
        assert ea[key]["digest"] == eb[key]["digest"], ea[key]["kernel"]
        assert ea[key]["tileir"] == eb[key]["tileir"]
    with Store(cache_a) as store:
        cubin = store.get_compile(next(iter(ea))).cubin
    assert str(FIXTURE.parent).encode() not in cubin and b"base.py" not in cubin


def test_toolkit_env_vars_are_stripped_not_keyed(two_builds: dict) -> None:
    """CUDA_ROOT=/nonexistent makes tileiras itself fail; stripped, the build is the normal
    one (same toolchain, same keys, same bytes), and doctor says it strips the variable."""
    out_a, out_b = two_builds["a"][2], two_builds["b"][2]
    assert out_a["toolchain"] == out_b["toolchain"] and out_a["failed"] == 0
    with Store(two_builds["a"][1]) as store:
        assert all(store.get_compile(k) is not None for k in _entries(two_builds["a"][1]))
    doctor = subprocess.run([sys.executable, "-m", "ctbuild", "doctor", "--json", "--cache",
                             str(two_builds["a"][1])], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "CUDA_ROOT": "/nonexistent"})
    report = json.loads(doctor.stdout)
    assert report["stripped_env"] == {"CUDA_ROOT": "/nonexistent"}, doctor.stderr
    assert not any("CUDA_ROOT" in p for p in report["problems"])


def test_a_bad_cuda_root_breaks_an_unstripped_tileiras(tmp_path: Path) -> None:
    """The reason for stripping: tileiras with CUDA_ROOT=/nonexistent fails to compile."""
    script = ("import os, sys\nsys.path.insert(0, sys.argv[1])\n"
              "from ctbuild.project import load_project\nfrom ctbuild.compile.compiler import tileir\n"
              "from ctbuild.compile.plan import job_and_signature\nfrom ctbuild.toolchain import probe\n"
              "from ctbuild.cutile import compile_cubin\n"
              "k = load_project(sys.argv[1] + '/ctbuild.toml').kernels()[0]\n"
              "cfg = k.candidates(k.workloads[0], 'sm_90').kept[0]\n"
              "_, sig = job_and_signature(k, cfg, k.workloads[0], 'sm_90', 'x')\n"
              "ir = tileir(k, cfg, sig, 'sm_90').front_end\n"
              "open(sys.argv[2], 'wb').write(ir.bytecode)\n"
              "os.environ['CUDA_ROOT'] = '/nonexistent'\n"
              "compile_cubin(sys.argv[2], k.compiler_options(cfg), 'sm_90', ir, None)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(FIXTURE), str(tmp_path / "k.bc")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode != 0 and "TileCompiler" in proc.stderr, proc.stderr[-2000:]


def test_identity_check_passes_then_catches_a_planted_entry(two_builds: dict,
                                                            tmp_path: Path) -> None:
    config, cache, out = two_builds["b"]
    planted = tmp_path / "planted"
    shutil.copytree(cache, planted)
    with Store(planted) as store:
        key, meta = next((k, m) for k, m in store.compile_entries() if m.get("kernel") == "idk")
        hit = store.get_compile(key)
        store.put_compile(key, hit.cubin, symbol=hit.symbol, meta={**meta, "tileir": "0" * 32})
    with ThreadPoolExecutor(max_workers=1) as pool:  # the two checks at once (two caches)
        clean = pool.submit(_verify_identity, config, cache)
        proc = subprocess.run([sys.executable, "-m", "ctbuild", "cache", "verify", "--identity",
                               "--config", str(config), "--cache", str(planted)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)
        clean_proc = clean.result()
    assert clean_proc.returncode == 0, explain(clean_proc)
    report = json.loads(clean_proc.stdout)
    assert report["checked"] == out["jobs"] and report["mismatches"] == []
    assert proc.returncode == 1, explain(proc)
    assert "identity: idk " in proc.stdout and key[:16] in proc.stdout


def test_declaration_edits_keep_cubins_and_records_constants_replay(two_builds: dict,
                                                                    tmp_path: Path) -> None:
    """Adding a workload (and key=) to a built kernel compiles only its new jobs and keeps its
    tuning record; a runtime miss of ``eps`` (a ct.Constant through args=) is recorded with its
    value and replays through ``precompile --from-record``."""
    config_b, cache_b, first = two_builds["b"]
    project, cache = tmp_path / "proj", tmp_path / "cache"
    shutil.copytree(config_b.parent, project)
    shutil.copytree(cache_b, cache)
    config = project / "ctbuild.toml"
    record = tmp_path / "misses.jsonl"
    with ThreadPoolExecutor(max_workers=1) as pool:  # idk's record and add_eps's miss at once
        recorded = pool.submit(_runtime, "record", project, cache)
        assert _runtime("miss", project, cache, CTBUILD_RECORD=str(record)).strip() == "miss"
        recorded.result()
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["kernel"], r["workload"]["eps"]) for r in lines] == [("add_eps", 1e-6)]
    base = project / "idkernels" / "base.py"
    text = base.read_text()
    assert f"workloads=[{WORKLOAD}]" in text
    base.write_text(text.replace(f"workloads=[{WORKLOAD}]", f"workloads=[{WORKLOAD}, {FP16}]")
                    .replace('default={"TILE": 64}', 'key=None,\n    default={"TILE": 64}'))
    proc, _, second = precompile("--config", str(config), "--cache", str(cache), "--json",
                                 "--workers", "1", "--from-record", str(record))
    assert proc.returncode == 0, explain(proc)
    # 2 configs of idk's new fp16 workload + 2 of add_eps at eps=1e-6, and the generic CUBIN
    # of each new dtype/constant pattern; nothing else rebuilt
    assert (second["cached"], second["compiled"]) == (first["jobs"], 6), second
    got = json.loads(_runtime("resolve", project, cache))
    assert got == {"config": {"TILE": 128}, "config_from": "cache", "cubin_from": "cache"}


def test_constant_through_args_is_in_the_tuning_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURE))
    from idkernels.eps import add_eps

    from ctbuild.serve.live_args import workload_spec
    w = add_eps.workloads[0]
    assert add_eps.constant_args() == {"eps"}
    other = type(w)({**w, "eps": 1e-6})
    assert add_eps.tuning_key(w) != add_eps.tuning_key(other)
    assert workload_spec(add_eps, other)["eps"] == 1e-6  # recorded as the value, not a Scalar


def _prune(config: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ctbuild", "cache", "prune", "--config",
                           str(config), "--cache", str(cache), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_prune_after_a_kernel_edit_removes_the_old_version(two_builds: dict,
                                                           tmp_path: Path) -> None:
    """Edit idk's body and rebuild: its old CUBINs, their tuning record and blobs are stale.
    prune --dry-run says so and removes nothing; the default keeps the last two versions;
    --keep 1 removes the old version only (add_eps and the new version stay, verify is clean)."""
    from ctbuild.compile.prune import plan_prune
    config_b, cache_b, _ = two_builds["b"]
    project, cache = tmp_path / "proj", tmp_path / "cache"
    shutil.copytree(config_b.parent, project)
    shutil.copytree(cache_b, cache)
    config = project / "ctbuild.toml"
    before = _entries(cache)
    old = {e["kernel_fp"] for e in before.values() if e["kernel"] == "idk"}
    assert len(old) == 1
    old_fp = old.pop()
    key0 = next(k for k, e in before.items() if e["kernel"] == "idk")
    with Store(cache) as store:  # the old version's winner, as `ctbuild tune` records it
        store.put_tuning("t" * 32, {"kernel": "idk", "kernel_fp": old_fp, "arch": "sm_90",
                                    "compile_key": key0, "config": before[key0]["config"]})
    base = project / "idkernels" / "base.py"
    text = base.read_text()
    assert "+ OFFSETS[0]" in text
    base.write_text(text.replace("+ OFFSETS[0]", "+ OFFSETS[1]"))
    proc, _, rebuilt = precompile("--config", str(config), "--cache", str(cache), "--json",
                                  "--workers", "1")
    assert proc.returncode == 0, explain(proc)
    stale = {k for k, e in before.items() if e["kernel_fp"] == old_fp}
    assert rebuilt["compiled"] == len(stale) > 0

    dry = _prune(config, cache, "--dry-run", "--keep", "1")
    assert dry.returncode == 0, explain(dry)
    assert f"would remove {old_fp[:12]}" in dry.stdout and "(dry run: nothing removed)" in dry.stdout
    assert len(_entries(cache)) == len(before) + len(stale)
    with Store(cache) as store:
        fps = {e["kernel"]: e["kernel_fp"] for k, e in store.compile_entries() if k not in before}
        fps["add_eps"] = next(e["kernel_fp"] for e in before.values() if e["kernel"] == "add_eps")
        assert not plan_prune(fps, store.compile_entries(), store.tuning_records(), 2).dropped

    done = _prune(config, cache, "--keep", "1", "--json")
    assert done.returncode == 0, explain(done)
    report = json.loads(done.stdout)
    after = _entries(cache)
    stale_blobs = {before[k]["digest"] for k in stale} - {e["digest"] for e in after.values()}
    assert report["removed"]["compile_entries"] == len(stale)
    assert report["removed"]["tuning_records"] == 1
    assert report["removed"]["blobs"] == len(stale_blobs) > 0
    assert set(after) == (set(before) - stale) | {k for k in after if k not in before}
    assert {e["kernel_fp"] for e in after.values() if e["kernel"] == "idk"} == {fps["idk"]}
    with Store(cache) as store:
        assert store.verify()["ok"] and store.get_tuning("t" * 32) is None
        assert store.stats()["blobs"] == len({e["digest"] for e in after.values()})
    bad = _prune(config, cache, "--keep", "0")
    errors = [line for line in bad.stderr.splitlines() if "error:" in line]
    assert bad.returncode == 2 and len(errors) == 1 and "--keep" in errors[0]


def _replant(store: Store, key: str, meta: dict) -> None:
    hit = store.get_compile(key)
    assert hit is not None
    store.put_compile(key, hit.cubin, symbol=hit.symbol, meta=meta)


def test_ir_backstop_rebuilds_and_refuses_an_entry_built_from_other_code(
        two_builds: dict, tmp_path: Path) -> None:
    """An entry whose recorded TileIR these sources do not give (what a fingerprint hole
    leaves) is refused by a serving process with CTBUILD_VERIFY=ir and rebuilt by precompile,
    with a warning naming the kernel; one without a recorded digest is rebuilt too (nothing
    tells what code it is), with a note; a build's own entries are remembered, so a no-op
    build derives nothing."""
    config, cache_b, first = two_builds["b"]
    cache = tmp_path / "cache"
    shutil.copytree(cache_b, cache)
    noop = _build(config, cache)
    assert noop["ir_check"]["derived"] == 0
    assert noop["ir_check"]["remembered"] == noop["ir_check"]["relied_on"] == first["jobs"]
    with Store(cache) as store:
        entries = dict(store.compile_entries())
        stale = next(k for k, m in entries.items() if m["kernel"] == "idk" and m["config"] ==
                     {"TILE": 64} and m.get("class", "exact") == "exact")
        bare = next(k for k, m in entries.items() if m["kernel"] == "add_eps")
        _replant(store, stale, {**entries[stale], "tileir": "0" * 32})
        _replant(store, bare, {k: v for k, v in entries[bare].items()
                               if k not in ("tileir", "tileir_format")})
    serving = subprocess.run([sys.executable, "-c", RUNTIME, "verify", str(config.parent),
                              str(cache)], capture_output=True, text=True, cwd=ROOT,
                             timeout=300, env={**os.environ, "CTBUILD_CACHE_DIR": str(cache),
                                               "CTBUILD_VERIFY": "ir"})
    assert serving.returncode == 0, serving.stderr[-3000:]
    assert json.loads(serving.stdout) == {"64 checked": "generic", "128 checked": "exact",
                                          "64 plain": "exact", "128 plain": "exact"}
    assert "kernel 'idk'" in serving.stderr and "fingerprint hole" in serving.stderr
    proc, _, out = precompile("--config", str(config), "--cache", str(cache), "--json",
                              "--workers", "1")
    assert proc.returncode == 0, explain(proc)
    assert (out["compiled"], out["cached"]) == (2, first["jobs"] - 2)
    check = out["ir_check"]
    assert {m["key"] for m in check["mismatches"]} == {stale, bare}
    assert check["unverifiable"] == 1
    assert 'kernel idk (idkernels.base) config {"TILE": 64}' in proc.stderr
    assert "fingerprint hole" in proc.stderr and stale[:16] in proc.stderr
    assert f"{bare[:16]} records no TileIR digest" in proc.stderr
    with Store(cache) as store:
        assert store.get_compile(stale).meta["tileir"] == entries[stale]["tileir"]


#: A check of a build's entries as `ctbuild tune` runs it, started from a script of its own
#: (another ``__main__`` than the build's), in a process that has used multiprocessing.
CHECK_FROM_A_SCRIPT = r'''
import json, multiprocessing, sys
from ctbuild.arch import Arch
from ctbuild.compile.ir_check import check_cached
from ctbuild.compile.plan import make_plan
from ctbuild.project import load_project
from ctbuild.cache import Store
if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.map(abs, [1])
    project = load_project(sys.argv[1], cache_dir=sys.argv[2])
    kernels = project.kernels()
    fp = next(iter(Store(sys.argv[2]).toolchains()))
    plan = make_plan(kernels, [Arch("sm_90")], fp, project.cap, {})
    _, report = check_cached(project.cache_dir, project.modules, [str(p) for p in project.paths],
                             fp, [j.to_json() for j in plan.jobs.values()], 1)
    print(json.dumps({"derived": report.derived, "remembered": report.remembered,
                      "relied_on": report.relied_on}))
'''


def test_a_check_started_from_another_entry_point_uses_the_builds_memo(
        two_builds: dict, tmp_path: Path) -> None:
    """The entry point is not the project's code: a tune's check (here a script of its own,
    whose process also used multiprocessing) after a build derives nothing again."""
    config, cache_b, first = two_builds["b"]
    cache = tmp_path / "cache"
    shutil.copytree(cache_b, cache)
    script = tmp_path / "check_entries.py"
    script.write_text(CHECK_FROM_A_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(config), str(cache)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got == {"derived": 0, "remembered": first["jobs"], "relied_on": first["jobs"]}


#: `ctbuild tune`'s check (`ctbuild.commands.tune.check_identity`) on a cache, with a plan that
#: counts whether it was made: prints what the check found and whether it planned.
TUNE_CHECK = r'''
import json, sys
import ctbuild.compile.plan as plan
from ctbuild.commands.tune import check_identity
from ctbuild.project import load_project
from ctbuild.cache import Store
if __name__ == "__main__":
    planned, make = [], plan.make_plan
    plan.make_plan = lambda *a, **k: planned.append(1) or make(*a, **k)
    project = load_project(sys.argv[1], cache_dir=sys.argv[2])
    fp = next(iter(Store(sys.argv[2]).toolchains()))
    check_identity(project, project.kernels(), "sm_90", fp, {}, 1)
    with Store(sys.argv[2]) as store:
        keys = [k for k, _ in store.compile_entries()]
    print(json.dumps({"planned": len(planned), "entries": len(keys)}))
'''


def test_a_tune_plans_nothing_where_every_entry_is_verified(two_builds: dict,
                                                            tmp_path: Path) -> None:
    """After a build every entry is verified under these sources: a tune's check makes no
    plan (cuTile's name mangling for every candidate: about a second of a tune's start). One
    entry whose recorded TileIR the memo has not verified (here: planted) makes it plan,
    check and remove that entry, as before."""
    config, cache_b, first = two_builds["b"]
    cache = tmp_path / "cache"
    shutil.copytree(cache_b, cache)
    script = tmp_path / "tune_check.py"
    script.write_text(TUNE_CHECK)

    def check() -> dict:
        proc = subprocess.run([sys.executable, str(script), str(config), str(cache)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {**json.loads(proc.stdout), "stderr": proc.stderr}
    clean = check()
    assert (clean["planned"], clean["entries"]) == (0, first["jobs"])
    with Store(cache) as store:
        key, meta = next((k, m) for k, m in store.compile_entries() if m.get("kernel") == "idk")
        _replant(store, key, {**meta, "tileir": "0" * 32})
    planted = check()
    assert (planted["planned"], planted["entries"]) == (1, first["jobs"] - 1)
    assert "fingerprint hole" in planted["stderr"] and key[:16] in planted["stderr"]


def test_ir_check_memo_never_trusts_a_bad_file(tmp_path: Path) -> None:
    """A damaged, foreign or oversized memo is a memo of nothing (every entry is derived
    again), and remembering writes a fresh one; a remembered digest only counts for the
    same state and the same recorded digest."""
    from ctbuild.compile.ir_check import MEMO_FILE, MEMO_MAX_BYTES, Memo
    memo_file = tmp_path / MEMO_FILE
    for text in ("{not json", "[1, 2]", '{"format": 99, "projects": {}}', "[" * 100000):
        memo_file.write_text(text)
        assert Memo(tmp_path, "p").verified("s") == {}
    with open(memo_file, "wb") as f:
        f.truncate(MEMO_MAX_BYTES + 1)
    assert Memo(tmp_path, "p").verified("s") == {}
    Memo(tmp_path, "p").save("s", {"m": "1"}, {"k": "d"})
    again = Memo(tmp_path, "p")
    assert again.verified("s") == {"k": "d"} and again.verified("other") == {}
    assert again.changed_modules({"m": "2", "n": "1"}) == ["m", "n"]
    assert Memo(tmp_path, "another project").verified("s") == {}
