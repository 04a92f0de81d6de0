"""The answer-check worker: ``python -m gkv_rewards.worker PARENT_PID MODULE:FUNCTION`` (started by ``MathVerifier``).

Prints ``ready`` once the check is imported and warm (its module's ``warm_up()``, when it has one, has run: a first-use
cost that must not count against a check's time limit), then answers each stdin line ``[gold, pred]`` with one stdout
line: ``true`` / ``false``, or ``null`` when the check raised. Exits at end of input, and is killed with its parent.
"""

from __future__ import annotations

import importlib
import json
import sys

from gkv_rewards.process import die_with_parent


def main(parent_pid: int, check_path: str) -> None:
    die_with_parent(parent_pid)
    module, _, name = check_path.partition(":")
    loaded = importlib.import_module(module)
    check = getattr(loaded, name)
    if callable(getattr(loaded, "warm_up", None)):
        loaded.warm_up()
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        gold, pred = json.loads(line)
        try:
            result = bool(check(gold, pred))
        except Exception:  # noqa: BLE001 - any failure of a check is reported as such, never a crash
            result = None
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
