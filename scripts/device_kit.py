"""The device kit: wheels of what the GPU image lacks (``device-kit.txt``) and of this project's three
distributions, for one CPython version on x86-64 Linux, in one folder; one JSON line (files, bytes).

    python scripts/device_kit.py                          # .whl/ for the GPU image (CPython 3.12), <= 64 MiB
    python scripts/device_kit.py --python 3.11 --out .whl-floor   # the floor lane's rehearsal (make test-floor)

A package with no wheel on the index (antlr4-python3-runtime is an sdist) is built here, and refused unless the
build is pure Python (``py3-none-any``), so that it installs on the device. The folder is emptied of wheels first
(one version of each: two stop the device's install). ``scripts/device_check.sh`` installs the kit there.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, print_json

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def requirements(path: Path) -> list[str]:
    """The pinned requirement lines of a requirements file (comments and blank lines dropped)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, cwd=ROOT)


def fetch(requirement: str, python: str, out: Path) -> str:
    """Download ``requirement``'s wheel for ``python`` (no dependencies: the kit names each one), or build it
    when the index has only an sdist; returns how it came ("wheel" or "built")."""
    tags = [f"--platform={p}" for p in PLATFORMS]
    done = pip(
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        f"--python-version={python}",
        "--implementation=cp",
        *tags,
        "-d",
        str(out),
        requirement,
    )
    if done.returncode == 0:
        return "wheel"
    with tempfile.TemporaryDirectory() as scratch:
        built = pip("wheel", "-q", "--no-deps", "-w", scratch, requirement)
        wheels = list(Path(scratch).glob("*.whl"))
        if built.returncode != 0 or len(wheels) != 1:
            raise SystemExit(
                f"error: no wheel for {requirement} (python {python}): {(done.stderr or built.stderr)[-800:]}"
            )
        if not wheels[0].name.endswith("-py3-none-any.whl"):
            raise SystemExit(
                f"error: {requirement} built as {wheels[0].name}, not pure Python: it would not install on the device"
            )
        wheels[0].rename(out / wheels[0].name)
    return "built"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default="3.12", help="the device's CPython version (the GPU image: 3.12)")
    parser.add_argument("--out", type=Path, default=ROOT / ".whl")
    parser.add_argument("--requirements", type=Path, default=ROOT / "device-kit.txt")
    parser.add_argument("--limit-mib", type=float, default=64.0, help="what one device call carries")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    sources = {req: fetch(req, args.python, args.out) for req in requirements(args.requirements)}
    for folder in ("rollout", "rewards", "."):  # the project: pure Python, built from this checkout
        # setuptools copies into <folder>/build/lib and leaves there what an earlier build copied: a module moved
        # or deleted since would ship in the wheel beside its new home. That folder is a build output: emptied.
        shutil.rmtree(ROOT / folder / "build", ignore_errors=True)
        built = pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(args.out), str(ROOT / folder))
        if built.returncode != 0:
            raise SystemExit(f"error: building the wheel of {folder}: {built.stderr[-800:]}")
        sources[folder] = "project"
    files = sorted(args.out.glob("*.whl"))
    size = sum(f.stat().st_size for f in files)
    result = {
        "device_kit": str(args.out),
        "python": args.python,
        "files": [f.name for f in files],
        "sources": sources,
        "bytes": size,
        "mib": round(size / 2**20, 2),
        "limit_mib": args.limit_mib,
    }
    print_json(result)
    if size > args.limit_mib * 2**20:
        raise SystemExit(
            f"error: the kit is {size / 2**20:.1f} MiB, over the {args.limit_mib} MiB one device call carries"
        )


if __name__ == "__main__":
    main()
