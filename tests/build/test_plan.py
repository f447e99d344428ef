"""`ctbuild plan`: the examples plan fully; bad declarations fail early, naming the kernel."""
from __future__ import annotations

import json
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_cli

EXAMPLE_KERNELS = {"silu_mul", "rmsnorm", "matmul", "rope_inplace", "softmax_rows", "transpose"}


@pytest.fixture(scope="module")
def example_plan() -> dict:
    proc = run_cli("plan", "--config", str(EXAMPLES / "ctbuild.toml"), "--arch", "sm_90,sm_100",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_plan_lists_every_example_kernel(example_plan: dict) -> None:
    kernels = {k["name"]: k for k in example_plan["kernels"]}
    assert set(kernels) == EXAMPLE_KERNELS
    for k in kernels.values():
        assert k["jobs"] > 0
        assert {e["arch"] for e in k["entries"]} == {"sm_90", "sm_100"}


def test_jobs_equal_distinct_compile_keys(examples_on_path: Path) -> None:
    from ctbuild.arch import parse_archs
    from ctbuild.compile.plan import make_plan
    from ctbuild.project import load_project
    project = load_project(EXAMPLES / "ctbuild.toml")
    plan = make_plan(project.kernels(), parse_archs("sm_90,sm_100"), "fp")
    keys = [k for e in plan.entries for k in e.job_keys]
    assert len(plan.jobs) == len(set(keys))
    assert all(len(e.configs) == len(e.class_keys["exact"]) for e in plan.entries)
    assert all(len(set(e.class_keys["generic"])) == 1 for e in plan.entries)  # the default's


def test_cli_jobs_count_matches_python_plan(example_plan: dict, examples_on_path: Path) -> None:
    """The CLI's job counts (total and per kernel) equal the jobs of a plan made in Python."""
    from collections import Counter

    from ctbuild.arch import parse_archs
    from ctbuild.compile.plan import make_plan
    from ctbuild.project import load_project
    project = load_project(EXAMPLES / "ctbuild.toml")
    plan = make_plan(project.kernels(), parse_archs("sm_90,sm_100"), example_plan["toolchain"])
    assert example_plan["jobs"] == len(plan.jobs) > 0
    assert {k["name"]: k["jobs"] for k in example_plan["kernels"]} == dict(
        Counter(job.kernel for job in plan.jobs.values()))


def test_matmul_constraint_depends_on_arch(example_plan: dict) -> None:
    matmul = next(k for k in example_plan["kernels"] if k["name"] == "matmul")
    pruned = {e["arch"]: e["configs_pruned"] for e in matmul["entries"]}
    assert pruned["sm_100"] > pruned["sm_90"]  # 2-CTA clusters only on sm_100


def test_human_output(examples_on_path: Path) -> None:
    proc = run_cli("plan", "--config", str(EXAMPLES / "ctbuild.toml"))
    assert proc.returncode == 0, proc.stderr
    assert "compile jobs" in proc.stdout and "matmul" in proc.stdout


GOOD = '''
import cuda.tile as ct
import ctbuild
from ctbuild import Product, Tensor

@ctbuild.autotune(
    space=Product(TILE=[64, 128], occupancy=[1, 2]{where}),
    grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.{grid_axis}),),
    default={default},
    workloads=[{{"X": Tensor((1024,), "float32"), "Y": Tensor((1024,), "float32")}}],
)
@ct.kernel
def copy(X, Y, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    ct.store(Y, index=(bid,), tile=ct.load(X, index=(bid,), shape=(TILE,)))
'''


def make_project(tmp_path: Path, *, where: str = "", grid_axis: str = "TILE",
                 default: str = '{"TILE": 64, "occupancy": 1}', toml: str | None = None) -> Path:
    (tmp_path / "badkern.py").write_text(textwrap.dedent(GOOD.format(
        where=where, grid_axis=grid_axis, default=default)))
    config = tmp_path / "ctbuild.toml"
    config.write_text(toml if toml is not None else 'modules = ["badkern"]\narchs = ["sm_90"]\n')
    return config


def test_good_fixture_plans(tmp_path: Path) -> None:
    proc = run_cli("plan", "--config", str(make_project(tmp_path)), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["jobs"] == 5  # 4 configs + the default config's generic CUBIN


BAD_DECLARATIONS = [
    ({"grid_axis": "NOPE"}, "config has no axis 'NOPE'"),
    ({"where": ", where=lambda cfg, w, arch: cfg.TILE > 1000"}, "empty after pruning"),
    ({"default": '{"TILE": 32, "occupancy": 1}'}, "default TILE=32 is not one of that axis's values"),
    ({"where": ", where=lambda cfg: cfg.TILE == 128"}, "rejected by the constraint"),
    ({"where": ", where=lambda cfg: cfg.BAD == 1"}, "config has no axis 'BAD'"),
]
MALFORMED_CONFIGS = [
    ('modules = ["badkern"\n', "not valid TOML"),
    ('modules = "badkern"\n', "'modules' must be a list"),
    ('modules = ["badkern"]\nbogus = 1\n', "unknown key 'bogus'"),
    ('modules = ["nosuchmodule"]\n', "cannot import module 'nosuchmodule'"),
    ('modules = ["badkern"]\narchs = ["sm_42"]\n', "unknown GPU arch 'sm_42'"),
    ('archs = ["sm_90"]\n', "no modules to import"),
]


@pytest.fixture(scope="module")
def bad_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """`ctbuild plan` of every bad declaration and malformed config below, each in its own
    project, two processes at a time (each is a second or two of imports on one core); the
    tests check one each."""
    projects = {f"decl{i}": {"kwargs": kwargs} for i, (kwargs, _) in enumerate(BAD_DECLARATIONS)}
    projects.update({f"toml{i}": {"kwargs": {"toml": toml}}
                     for i, (toml, _) in enumerate(MALFORMED_CONFIGS)})

    def plan(name: str) -> object:
        config = make_project(tmp_path_factory.mktemp(name), **projects[name]["kwargs"])
        return run_cli("plan", "--config", str(config))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(projects, pool.map(plan, projects)))


@pytest.mark.parametrize("case,expected", list(enumerate(e for _, e in BAD_DECLARATIONS)),
                         ids=[f"kwargs{i}-{e}" for i, (_, e) in enumerate(BAD_DECLARATIONS)])
def test_bad_declaration_exits_2_naming_kernel(bad_plans: dict, case: int, expected: str
                                               ) -> None:
    proc = bad_plans[f"decl{case}"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "kernel 'copy'" in proc.stderr and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("case,expected", list(enumerate(e for _, e in MALFORMED_CONFIGS)),
                         ids=[f"{t}-{e}" for t, e in MALFORMED_CONFIGS])
def test_malformed_config_exits_2(bad_plans: dict, case: int, expected: str) -> None:
    proc = bad_plans[f"toml{case}"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_arch_flag(tmp_path: Path) -> None:
    proc = run_cli("plan", "--config", str(make_project(tmp_path)), "--arch", "sm_90,gfx942")
    assert proc.returncode == 2 and "unknown GPU arch 'gfx942'" in proc.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    proc = run_cli("plan", "--config", str(tmp_path / "nope.toml"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run_cli("plan", "--config", "/dev/null")            # there, but not a file to read
    assert proc.returncode == 2 and "/dev/null is not a regular file" in proc.stderr, proc.stderr


def test_pyproject_tool_table(tmp_path: Path) -> None:
    make_project(tmp_path, toml="")
    (tmp_path / "ctbuild.toml").unlink()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.ctbuild]\nmodules = ["badkern"]\narchs = ["sm_100"]\n')
    proc = run_cli("plan", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kernels"][0]["entries"][0]["arch"] == "sm_100"
