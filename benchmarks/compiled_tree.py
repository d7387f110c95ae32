"""A copy of this checkout with the engine compiled, as a wheel built here carries it.

Run from the repository root::

    python -m benchmarks.compiled_tree /tmp/compiled        # copy, compile in place, print the files
    cd /tmp/compiled && python -m benchmarks.bench_quickstart --cases 10k,100k
    python -m benchmarks.compare_trees --base . --new /tmp/compiled --cases qs_100k,disagg_100k

The benchmarks import the package of the directory they run in, so a checkout measures the
modules as source; this makes a directory whose package has the compiled modules beside their
sources (``hatch_build.compile_in_place``, the build hook's own function), which Python imports
first. The copy holds the files git tracks (and this checkout's edits to them).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def make_compiled_tree(target: Path) -> list[Path]:
    """Copy the checkout's tracked files into *target* (which must not exist) and compile the
    engine there in place; return the extension files made."""
    sys.path.insert(0, str(REPO))
    try:
        from hatch_build import compile_in_place
    finally:
        sys.path.pop(0)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    target.mkdir(parents=True)
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return compile_in_place(target)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compiled_tree", description=__doc__.split("\n\n")[0])
    p.add_argument("target", type=Path, help="the directory to make (must not exist)")
    args = p.parse_args(argv)
    if args.target.exists():
        p.error(f"{args.target} exists: give a new directory")
    try:
        made = make_compiled_tree(args.target)
    except subprocess.CalledProcessError as exc:
        print((exc.stdout or "") + (exc.stderr or ""), file=sys.stderr)
        return 1
    for path in made:
        print(args.target / path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
