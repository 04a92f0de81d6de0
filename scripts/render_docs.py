"""Every measured table in the docs from ``results/``: each block

    <!-- results:FILE#VIEW -->
    ...
    <!-- /results -->

of README.md and the markdown under docs/ is rewritten with the table VIEW of ``results/FILE``, made by the
benchmark that wrote FILE (its ``tables(view, result)``: the figures with the command, date, commit and machine
they came from), so no figure in the docs is copied by hand or left behind by a newer result.

    python scripts/render_docs.py            # rewrite the blocks
    python scripts/render_docs.py --check    # change nothing; exit 1 naming each stale block (a test runs it)
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

from _common import ROOT

from gkv_train.jsonio import write_atomically

BLOCK = re.compile(r"<!-- results:([\w.]+)#(\w+) -->\n.*?<!-- /results -->", re.S)


def render(text: str, results: Path) -> str:
    """``text`` with every results block rewritten from the files under ``results``: ``results/NAME.json`` by
    the ``tables`` of ``scripts/NAME.py``, the benchmark that writes it."""

    def block(match) -> str:
        name, view = match.groups()
        script = name.removesuffix(".json")
        if not (ROOT / "scripts" / f"{script}.py").is_file():
            raise SystemExit(f"error: a docs block names results/{name}, but no scripts/{script}.py renders it")
        tables = importlib.import_module(script).tables
        result = json.loads((results / name).read_text())
        return f"<!-- results:{name}#{view} -->\n{tables(view, result)}<!-- /results -->"

    return BLOCK.sub(block, text)


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args()
    stale = []
    for doc in documents(ROOT):
        text = doc.read_text()
        new = render(text, ROOT / "results")
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                write_atomically(doc, new)
    if args.check and stale:
        print("stale results tables in " + ", ".join(map(str, stale)) + ": run python scripts/render_docs.py",
              file=sys.stderr)
        sys.exit(1)
    print(("rewrote " if stale else "up to date: ") + (", ".join(map(str, stale)) or "every results table"))


if __name__ == "__main__":
    main()
