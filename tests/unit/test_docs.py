"""The examples in the documentation run as written."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", ["policies.md", "batching.md", "network.md", "speculative.md", "processes.md"])
def test_doc_examples_run(name, monkeypatch):
    """Every ``>>>`` example of the page gives the output it shows."""
    monkeypatch.chdir(DOCS.parent)
    from simpy_llm.policies.scheduling import scheduler_policies

    before = set(scheduler_policies.names())
    try:
        result = doctest.testfile(str(DOCS / name), module_relative=False, optionflags=doctest.ELLIPSIS)
    finally:
        for added in set(scheduler_policies.names()) - before:
            scheduler_policies._items.pop(added)  # noqa: SLF001 - the page registers examples
    assert result.attempted > 0
    assert result.failed == 0
