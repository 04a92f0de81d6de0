"""Every measured table in the docs from ``results/``: each block

    <!-- results:FILE#VIEW -->
    ...
    <!-- /results -->

of README.md, ARCHITECTURE.md and the markdown under docs/ is rewritten with the table VIEW of ``results/FILE``,
made by the benchmark that wrote FILE (its ``tables(view, result)``: the figures with the command, date, commit and
machine they came from), so no figure in the docs is copied by hand or left behind by a newer result. The benchmark
is the one a results file names (its ``"script"`` key, or ``scripts/bench_<its "benchmark" key>.py``), else
``scripts/NAME.py`` for ``results/NAME.json``, or for ``results/NAME_TAG.json`` (a run tagged ``TAG``) the longest
such prefix of the name that is a script. A ``.jsonl``
file is read as its list of records. A table that compares runs names several files, ``FILE1+FILE2#VIEW``:
``result`` is then the list of them, in that order.

Each block ``<!-- config:COMMAND -->`` ... ``<!-- /config -->`` (COMMAND: train, evaluate, traces) is rewritten
with the keys of that command's configuration, their types, defaults and help, from the dataclasses themselves
(``gkv_train.config.keyhelp``, what ``gkv-train COMMAND --help`` prints); TRL's own fields of ``train`` are named, not
listed (their help is TRL's). Each block ``<!-- methods -->`` ... ``<!-- /methods -->`` is rewritten with the
registered compression methods (``gkv_rollout.methods``): name, one-line summary, own options.

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

from gkv_train.jsonio import write_atomically

from _common import ROOT

BLOCK = re.compile(r"<!-- results:([\w.+]+)#(\w+) -->\n.*?<!-- /results -->", re.S)
CONFIG = re.compile(r"<!-- config:(\w+) -->\n.*?<!-- /config -->", re.S)
METHODS = re.compile(r"<!-- methods(:detail)? -->\n.*?<!-- /methods -->", re.S)


def renderer(name: str) -> str:
    """The script that renders ``results/name``: the longest prefix of its stem, cut at underscores, that names
    a script whose module has a ``tables`` function, its own or the package's it names (``bench_scaling_8192.json``:
    ``bench_scaling``; ``bench_rl_evidence_long_recall.json``: ``bench_rl_evidence``, whose ``tables`` is
    ``gkv_train.evidence.tables``)."""
    parts = name.rsplit(".", 1)[0].split("_")
    for end in range(len(parts), 0, -1):
        script = "_".join(parts[:end])
        if (ROOT / "scripts" / f"{script}.py").is_file() and callable(
            getattr(importlib.import_module(script), "tables", None)
        ):
            return script
    raise SystemExit(
        f"error: a docs block names results/{name}, but no script under scripts/ renders it "
        "(a tables(view, result) function in scripts/<a prefix of its name>.py)"
    )


def named_renderer(result) -> str | None:
    """The script a results file names: its ``"script"``, or ``bench_<its "benchmark">`` where that script exists
    (``gkv-train compare`` writes ``"benchmark": "rl_evidence"`` into a results file of any name)."""
    if not isinstance(result, dict):
        return None
    if result.get("script"):
        return result["script"]
    named = f"bench_{result.get('benchmark')}"
    return named if result.get("benchmark") and (ROOT / "scripts" / f"{named}.py").is_file() else None


def read(path: Path):
    """A results file: a JSON document, or a ``.jsonl`` file's list of records."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def render(text: str, results: Path) -> str:
    """``text`` with every results block rewritten from the files under ``results``, each by the ``tables`` of
    the benchmark that writes it (``renderer``)."""

    def block(match) -> str:
        names, view = match.groups()
        files = names.split("+")
        found = [read(results / name) for name in files if name]
        scripts = {named_renderer(r) or renderer(name) for name, r in zip(files, found)}
        if len(scripts) != 1 or len(found) != len(files):
            raise SystemExit(f"error: the docs block results:{names} must name files of one benchmark, joined by +")
        tables = importlib.import_module(scripts.pop()).tables
        return (
            f"<!-- results:{names}#{view} -->\n{tables(view, found if len(files) > 1 else found[0])}<!-- /results -->"
        )

    return BLOCK.sub(block, text)


def config_table(command: str) -> str:
    """The keys of ``command``'s configuration as a markdown table (TRL's own fields of ``train`` named in a line
    after it)."""
    from gkv_train.config.compose import JOBS
    from gkv_train.config.keyhelp import changed_defaults, job_rows

    if command not in JOBS:
        raise SystemExit(f"error: a docs block names config:{command}; choose one of {', '.join(JOBS)}")
    own, trl = job_rows(command)

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| key | type | default | what it sets |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {cell(kind)} | `{cell(default)}` | {cell(text)} |" for key, kind, default, text in own]
    if trl:
        lines += [
            "",
            "Every other field of TRL's `GRPOConfig` (`learning_rate`, `beta`, `loss_type`, "
            "`weight_decay`, `num_iterations`, ...) is a key under its own name, with TRL's type, default and "
            "help (`gkv-train train --help` lists them). The defaults this project changes, declared on the "
            "configuration classes with their reason:",
            "",
            "| key | default here | TRL's / transformers' | why |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| `{key}` | `{here}` | `{theirs}` | {why} |" for key, here, theirs, why in changed_defaults(command)
        ]
    return "\n".join(lines) + "\n"


def render_config(text: str) -> str:
    """``text`` with every configuration block rewritten (``config_table``)."""
    return CONFIG.sub(lambda m: f"<!-- config:{m.group(1)} -->\n{config_table(m.group(1))}<!-- /config -->", text)


def methods_table(detail: bool = False) -> str:
    """Every registered method (``gkv_rollout.methods``) with its one-line summary (``detail``: its class's
    docstring, and the shared options it sets) and its own options with their defaults."""
    import dataclasses
    import inspect

    from gkv_rollout.methods import SHARED, EvictionMethod, field_default, own_fields
    from gkv_rollout.registry import registered

    what = "what it does (the class's docstring)" if detail else "one line"
    lines = [f"| method | {what} | its options (`compression.<name>`) |", "|---|---|---|"]
    base = {f.name: field_default(f) for f in dataclasses.fields(EvictionMethod)}
    for name, kind in registered().items():
        options = [f"`{f.name}` {field_default(f)!r}" for f in own_fields(kind)]
        text = kind.summary
        if detail:
            text = " ".join(inspect.getdoc(kind).split("\n\n")[0].split())
            shared = {
                f.name: field_default(f)
                for f in dataclasses.fields(kind)
                if f.name in SHARED and (f.name not in base or field_default(f) != base[f.name])
            }
            if shared:
                text += " Shared options set: " + ", ".join(f"`{k}` {v}" for k, v in shared.items()) + "."
        cell = text.replace("|", "\\|")
        lines.append(f"| `{name}` | {cell} | {', '.join(options) or '-'} |")
    return "\n".join(lines) + "\n"


def render_methods(text: str) -> str:
    """``text`` with every methods block rewritten (``methods_table``; ``methods:detail``: with the docstrings)."""
    return METHODS.sub(
        lambda m: f"<!-- methods{m.group(1) or ''} -->\n{methods_table(bool(m.group(1)))}<!-- /methods -->", text
    )


def documents(root: Path) -> list[Path]:
    return [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").rglob("*.md"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args()
    stale = []
    for doc in documents(ROOT):
        text = doc.read_text()
        new = render_methods(render_config(render(text, ROOT / "results")))
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                write_atomically(doc, new)
    if args.check and stale:
        print(
            "stale results tables in " + ", ".join(map(str, stale)) + ": run python scripts/render_docs.py",
            file=sys.stderr,
        )
        sys.exit(1)
    print(("rewrote " if stale else "up to date: ") + (", ".join(map(str, stale)) or "every results table"))


if __name__ == "__main__":
    main()
