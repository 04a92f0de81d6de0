"""The train / test splits of the built-in (generated) tasks: disjoint by construction."""

from __future__ import annotations

TEST_POOL = 1024  # the built-in test split is (a prefix of) these many problems, all excluded from train


def check_builtin_request(task: str, split: str, n: int | None) -> None:
    """A built-in task has the splits train and test and gives at least one problem (``n`` None: its default)."""
    if split not in ("train", "test"):
        raise ValueError(f"{task} has splits train and test, not {split!r}")
    if n is not None and n < 1:
        raise ValueError(f"the built-in task needs at least 1 problem, {n} requested")


def held_out_split(stream, n: int | None, split: str, task: str, space: int, more: str) -> list[tuple]:
    """``n`` distinct draws ``(text, ...)`` of a built-in task's ``split`` (n None: all). ``stream(which)`` yields the
    draws of one random stream; the test split is the distinct problems of the first ``TEST_POOL`` draws of stream
    ``test`` and train draws stream ``train`` without them, so the two never share a problem. ``space``: how many
    distinct problems the task can write; ValueError naming ``task`` (and ``more``, how to get more) when the split
    cannot give ``n``."""
    test_stream = stream("test")
    draws = (next(test_stream) for _ in range(TEST_POOL))
    pool = list({draw[0]: draw for draw in draws}.values())  # distinct, in order
    if split == "test":
        if n is not None and n > len(pool):
            raise ValueError(
                f"the test split of {task} holds {len(pool)} distinct problems, data.limit={n} asks for more"
            )
        return pool[:n]
    available = space - len(pool)
    if n is None or n > available:
        asked = "data.limit=null asks for all of them" if n is None else f"data.limit={n} asks for more"
        raise ValueError(
            f"{task} has {space} distinct problems, {len(pool)} of them held out for the test "
            f"split, so the train split can give at most {available}: {asked} (or {more})"
        )
    held_out, seen, chosen = {draw[0] for draw in pool}, set(), []
    for draw in stream(split):
        if draw[0] in held_out or draw[0] in seen:
            continue
        seen.add(draw[0])
        chosen.append(draw)
        if len(chosen) == n:
            break
    return chosen
