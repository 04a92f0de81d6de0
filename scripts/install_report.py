"""What ``pip install`` of this project would change in an existing environment: pip's own dry-run report of
installing the three distributions of a source tree with a given Python, read as distributions added and
distributions replaced (installed version -> the one pip would take); one JSON line.

    python scripts/install_report.py --python .venv-floor/bin/python             # this checkout
    python scripts/install_report.py --python .venv-floor/bin/python --tree ../old --label before

``--site`` adds a folder to that Python's path (the device kit installed with ``--target``), so what it holds
counts as installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from _common import ROOT, print_json


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(python: str, env: dict) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, env=env)
    return {canonical(k): v for k, v in json.loads(out.stdout).items()}


def tables(view: str, reports: list[dict]) -> str:
    """``scripts/render_docs.py``'s view ``installs`` of ``results/install_report.jsonl``: per report (label),
    what installing the tree into the environment would replace and add (pip's dry run)."""
    if view != "installs":
        raise SystemExit(f"error: install_report has the view installs, not {view!r}")
    lines = ["| | replaced | added |", "|---|---|---|"]
    for r in reports:
        replaced = ", ".join(f"{n} {v}" for n, v in r["replaced"].items()) or "nothing"
        lines.append(f"| {r['install_report']} | {replaced} | {', '.join(r['added']) or 'nothing'} |")
    stacks = {json.dumps(r["stack_before"]) for r in reports}
    stack = (
        ", ".join(f"{n} {v}" for n, v in reports[0]["stack_before"].items() if v) if len(stacks) == 1 else "(differs)"
    )
    return (
        "\n".join(lines) + f"\n\ninto an environment holding {stack}; `python scripts/install_report.py --python "
        f"{reports[0]['python']} --tree <checkout> --label <label>`\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the environment's Python")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the source tree to install (default: this checkout)")
    parser.add_argument("--site", type=Path, default=None, help="a folder on that Python's path (PYTHONPATH)")
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    env = {**os.environ, **({"PYTHONPATH": str(args.site)} if args.site else {})}
    env.pop("PIP_CONSTRAINT", None)
    present = installed(args.python, env)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        folders = [str(args.tree / "rollout"), str(args.tree / "rewards"), str(args.tree)]
        done = subprocess.run(
            [args.python, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report), *folders],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"error: pip's dry run failed: {done.stderr[-2000:]}")
        planned = {
            canonical(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]
        }
    ours = {"gkv-train", "gkv-rollout", "gkv-rewards"}
    stack = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "numpy", "tokenizers", "huggingface-hub")
    print_json(
        {
            "install_report": args.label,
            "tree": str(args.tree),
            "python": args.python,
            "stack_before": {name: present.get(name) for name in stack},
            "replaced": {
                n: f"{present[n]} -> {v}" for n, v in sorted(planned.items()) if n in present and n not in ours
            },
            "added": {n: v for n, v in sorted(planned.items()) if n not in present and n not in ours},
            "nvidia_or_cuda_wheels_added": sorted(
                n for n in planned if n.startswith(("nvidia-", "cuda-")) or n == "triton"
            ),
        }
    )


if __name__ == "__main__":
    main()
