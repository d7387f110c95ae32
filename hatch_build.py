"""The wheel's build hook: the engine compiled with mypyc, when the machine can compile it.

A wheel always carries every module as Python source. When mypy's compiler (mypyc), setuptools
and a C compiler with Python's headers are at hand, it also carries the modules of
:data:`COMPILED` compiled to C extensions, which Python imports in their place: the same code,
the same results to the bit (``tests/integration/test_compiled_engine.py``), in about 0.6 of
the time per request (``benchmarks/RESULTS.md``).

Compiled, their classes are mypyc's native classes: ``Replica`` stays open to subclasses written in
Python (``mypyc_attr(allow_interpreted_subclasses=True)``); a ``PrefixCache`` cannot be pickled
or deep-copied, which nothing in a run does.

``SIMPY_LLM_COMPILE`` chooses: ``auto`` (the default) compiles when it can and otherwise builds a
pure-Python wheel with a warning saying why; ``1`` compiles or fails the build; ``0`` never
compiles. An editable install (``pip install -e .``) is never compiled, so that an edit to the
source takes effect at once.

``python hatch_build.py DIR`` compiles the modules in place in DIR, a copy of the repository (what
``benchmarks/compiled_tree.py`` makes to measure the compiled engine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

COMPILED = ("simpy_llm/serving/engine.py", "simpy_llm/serving/prefix_cache.py")
"""The modules compiled, relative to the repository root: the engine and its prefix cache, where
a run spends most of its time (the cache too, or its cost against the compiled engine would
grow threefold). Each must give byte-identical records compiled and as source."""
GROUP = "simpy_llm"
"""The name of the shared library mypyc builds for them (``simpy_llm__mypyc``)."""
MYPY_ARGS = ("--ignore-missing-imports", "--follow-imports=silent")
"""mypy's options for the compilation: the modules compiled type-check; what they import is read
for its types only (a package without type information is taken as Any)."""
MODES = ("auto", "0", "1")
"""The values ``SIMPY_LLM_COMPILE`` may take."""


def compile_in_place(tree: Path, modules: tuple[str, ...] = COMPILED) -> list[Path]:
    """Compile *modules* of the package in *tree* (a directory holding ``simpy_llm/``) in place
    with mypyc; return the extension files made, relative to *tree*.

    Raises ``subprocess.CalledProcessError`` (with mypyc's and the compiler's output) when the
    machine cannot compile them: no mypy, no setuptools, no C compiler or no Python headers.
    """
    before = set(tree.rglob("*.so")) | set(tree.rglob("*.pyd"))
    build = tempfile.mkdtemp(prefix="simpy_llm_mypyc_")
    script = (
        "from mypyc.build import mypycify\n"
        "from setuptools import setup\n"
        f"setup(name='simpy_llm_compiled', ext_modules=mypycify({[*MYPY_ARGS, *modules]!r}, group_name={GROUP!r}),"
        f" script_args=['build_ext', '--inplace', '--build-temp', {build!r}, '--build-lib', {build!r}])\n"
    )
    # Its own process, in the tree (mypy reads the package's sources from there), with the
    # project's pyproject.toml set aside: its metadata is hatchling's, not setuptools' to read.
    project = tree / "pyproject.toml"
    aside = tree / "pyproject.toml.aside"
    if project.exists():
        project.rename(aside)
    try:
        subprocess.run([sys.executable, "-c", script], cwd=tree, check=True, capture_output=True, text=True)
    finally:
        if aside.exists():
            aside.rename(project)
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(tree / ".mypy_cache", ignore_errors=True)
    made = (set(tree.rglob("*.so")) | set(tree.rglob("*.pyd"))) - before
    return sorted(path.relative_to(tree) for path in made)


def compile_mode() -> str:
    """``SIMPY_LLM_COMPILE``, checked (module docstring)."""
    mode = os.environ.get("SIMPY_LLM_COMPILE", "auto").strip() or "auto"
    if mode not in MODES:
        raise ValueError(f"SIMPY_LLM_COMPILE={mode!r}: expected one of {', '.join(MODES)}")
    return mode


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script, or imported by a test without hatchling
    BuildHookInterface = object  # type: ignore[assignment,misc]


class CompileHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """Hatchling's hook adding the compiled modules to a wheel (module docstring)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._tmp: str | None = None
        mode = compile_mode()
        if self.target_name != "wheel" or version == "editable" or mode == "0":
            return
        self._tmp = tempfile.mkdtemp(prefix="simpy_llm_wheel_")
        tree = Path(self._tmp)
        shutil.copytree(Path(self.root) / "simpy_llm", tree / "simpy_llm", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
        try:
            made = compile_in_place(tree)
        except (OSError, subprocess.CalledProcessError) as exc:
            if mode == "1":
                raise RuntimeError(f"SIMPY_LLM_COMPILE=1 and the engine could not be compiled:\n{_output(exc)}") from exc
            self.app.display_warning(
                "simpy_llm: the engine was not compiled (a pure-Python wheel, slower): "
                f"{_output(exc).strip().splitlines()[-1] if _output(exc).strip() else exc}. "
                "A C compiler and Python's headers make it compile; SIMPY_LLM_COMPILE=0 builds pure Python without this warning."
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for rel in made:
            build_data["force_include"][str(tree / rel)] = rel.as_posix()

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)  # type: ignore[arg-type]


def _output(exc: BaseException) -> str:
    return (getattr(exc, "stdout", "") or "") + (getattr(exc, "stderr", "") or "") or str(exc)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python hatch_build.py DIR  (DIR: a copy of the repository, compiled in place)")
    for path in compile_in_place(Path(sys.argv[1])):
        print(path)
