"""Modules that fit in a head: none over 800 lines without saying, at its top, why it is kept whole."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "simpy_llm"
LIMIT = 800
MARK = "Kept whole (over 800 lines):"


def test_every_long_module_says_why_it_is_kept_whole() -> None:
    """Each module of more than 800 lines has, in its docstring, a paragraph starting with the mark
    and saying why (a module that grows past the limit is split or explains itself)."""
    silent = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > LIMIT and MARK not in (ast.get_docstring(ast.parse(text)) or ""):
            silent.append(f"{path.relative_to(PACKAGE.parent)} ({text.count(chr(10))} lines)")
    assert silent == [], f"split these modules, or say at their top why each is kept whole ({MARK!r}): {silent}"
