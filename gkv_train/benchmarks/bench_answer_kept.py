"""What G-KV holds when the answer is predicted: does training under the record teach a model to attend so that the
compression keeps what the answer needs? (``docs/benchmarks/rl_evidence.md``, the mechanism check.)

For ``long_recall`` models (the untrained one and each ``--adapters/<recipe>-s<seed>-lr<rate>``): the evaluation's
held-out problems (settings read from ``--evidence``, the rl_evidence results file) are rolled out under its G-KV
compression with the given story fed as if sampled; at the story's last token, the query that predicts the
answer, the record (``kept_at``) says which keys each (layer, KV head) part held. Per problem: the share of parts
holding every token of the number at its place in the prompt, in the story's first sentence, at either, and, as
the chance level, of a span of as many tokens at a seeded random place among the middle sentences.

    python scripts/bench_answer_kept.py --evidence results/bench_rl_evidence_long_recall.json \
        --adapters results/rl_evidence_long_recall --output-root ../outputs/answer_kept \
        --results results/bench_answer_kept.json [--worker 0/2]

Each (model, batch) is written to ``--output-root`` as it finishes and never recomputed (resumable; ``--worker i/n``
takes every n-th model, for one-thread workers side by side). Every argument and input is checked before any work:
the evidence's settings and cells, each adapter this worker measures against the model, the output root's
``settings.json`` (written with the first result: an output root measured under other settings is refused) and
kept files (one holding other problems, or damaged, is refused naming it), the folder of ``--results``. Once every
model is in, the report: per recipe over
seeds (hierarchical 95 % intervals over seeds and problems), the judged differences (each recipe's seeds resampled
on their own), shares by layer thirds, and pass@1 of the evaluation's ``gkv-b<budget>`` cells by whether the share
is 0. One JSON line; ``--results`` gets the section.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from gkv_train.argument_types import count, input_file, input_folder, output_file, output_folder, worker
from gkv_train.jsonio import dumps, print_json, read_state, write_atomically
from gkv_train.models import check_adapter
from gkv_train.problems.data import load_problems
from gkv_train.provenance import origin, provenance
from gkv_train.stats import hierarchical_interval, independent_interval

PLACES = ("prompt", "story", "either", "control")
JUDGED = (
    ("rl_sparse_noclip", "untrained"),
    ("rl_sparse_noclip", "rl_full_noclip"),
    ("rl_sparse_noclip", "sparse_rl_noclip"),
)


def token_span(tokenizer, ids: list[int], start_char: int, end_char: int) -> list[int]:
    """Indices of the tokens of ``ids`` whose decoded text overlaps characters [start_char, end_char) of
    ``tokenizer.decode(ids)``."""
    ends = [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]
    starts = [0] + ends[:-1]
    return [k for k in range(len(ids)) if starts[k] < end_char and ends[k] > start_char]


def number_span(tokenizer, ids: list[int], number: str, after: str = "") -> list[int]:
    """The tokens of the first standalone occurrence of ``number`` in ``ids`` from where the text ``after`` begins
    (a chat template's own digits, a date, come before the problem); checked to spell it."""
    text = tokenizer.decode(ids)
    found = re.compile(rf"(?<!\d){number}(?!\d)").search(text, max(text.find(after), 0))
    if found is None:
        raise ValueError(f"{number} is not in {text[:80]!r}...")
    span = token_span(tokenizer, ids, found.start(), found.end())
    if tokenizer.decode([ids[k] for k in span]).strip() != number:
        raise ValueError(f"the tokens {span} spell {tokenizer.decode([ids[k] for k in span])!r}, not {number}")
    return span


def problem_shares(
    record, row: int, prompt_ids: list[int], story: list[int], number: str, problem: str, tokenizer, rng
) -> dict:
    """The held shares of one rolled-out problem (``row`` of the rollout; ``prompt_ids`` its real prompt tokens,
    ``story`` the given prefix, ``problem`` the problem's text inside the prompt): at the story's last token, per
    (layer, KV head) part, whether every token of each span is kept."""
    p = len(prompt_ids)
    query = p + len(story) - 1  # logical position of the story's last token
    kept = record.kept_at(row, query)  # bool [L * Hkv, query + 1]
    prompt_span = number_span(tokenizer, prompt_ids, number, after=problem)
    story_span = [p + k for k in number_span(tokenizer, story, number)]
    text = tokenizer.decode(story)
    middle_start = len(tokenizer.decode(story[: story_span[-1] + 1 - p]))
    middle_end = text.rindex("At the end of the day")
    middle = token_span(tokenizer, story, middle_start, middle_end)[1:-1]  # whole tokens inside the middle
    first = rng.randrange(middle[0], middle[-1] - len(story_span) + 2)
    control = [p + k for k in range(first, first + len(story_span))]
    held = {
        "prompt": kept[:, prompt_span].all(dim=1),
        "story": kept[:, story_span].all(dim=1),
        "control": kept[:, control].all(dim=1),
    }
    held["either"] = held["prompt"] | held["story"]
    layers = kept.shape[0] // record.evict_at.shape[2]
    return {
        **{place: held[place].float().mean().item() for place in PLACES},
        "either_by_layer": held["either"].reshape(layers, -1).float().mean(dim=1).tolist(),
        "spans": {"prompt": prompt_span, "story": story_span, "control": control},
    }


def evaluation_config(settings: dict):
    """The ``scripts/evaluate.py`` configuration of the rl_evidence bench's ``gkv-b<budget>`` cells: its model, task,
    held-out problems (split, count, seed) and G-KV settings."""
    from gkv_train.config import compose

    train, evaluation = settings["train"], settings["eval"]
    overrides = [
        f"model={settings['model']}",
        f"data.name={settings['task']['name']}",
        f"data.split={evaluation['split']}",
        f"data.sentences={settings['task']['sentences']}",
        f"data.limit={evaluation['problems']}",
        "methods=[gkv]",
        f"budgets=[{train['budget']}]",
        f"compression.window={settings['window']}",
        f"compression.interval={settings['interval']}",
        f"seed={evaluation['seed']}",
    ]
    config, _, _ = compose.configure("evaluate", overrides)
    return config


def measure(name: str, adapter: Path | None, config, problems, batch: int, folder: Path, settings: dict) -> None:
    """Every problem's shares for one model, batch by batch (each written to ``folder`` and kept; ``settings``
    written as its ``settings.json`` with the first result, when it holds none)."""
    from gkv_rollout.config import SamplingConfig
    from gkv_rollout.engine import RolloutEngine
    from gkv_train.models import load_model

    (compression,) = config.compressions()
    model = tokenizer = engine = None
    for start in range(0, len(problems), batch):
        path = folder / f"{name}-{start}.json"
        if not path.is_file():
            if model is None:
                model, tokenizer = load_model(config.model, adapter=None if adapter is None else str(adapter))
                engine = RolloutEngine(model, tokenizer, compression)
            part = problems.select(range(start, min(start + batch, len(problems))))
            stories = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in part["continuation"]]
            prompts = [config.data.prompt_template.format(problem=p) for p in part["problem"]]
            sampling = SamplingConfig(max_new_tokens=max(map(len, stories)) + 1, num_samples=1, seed=start)
            out = engine.generate(prompts, sampling, prefixes=stories)
            found = []
            for row, (pid, answer, problem, story) in enumerate(
                zip(part["id"], part["answer"], part["problem"], stories)
            ):
                real = out.sequences[row][out.attention_mask[row].bool()].tolist()
                prompt_ids = real[: int(out.prompt_lengths[row])]
                assert real[len(prompt_ids) : len(prompt_ids) + len(story)] == story, "the story was not fed as given"
                rng = random.Random(f"control:{pid}")
                found.append(
                    {"id": pid, **problem_shares(out.record, row, prompt_ids, story, answer, problem, tokenizer, rng)}
                )
            if not (folder / SETTINGS).is_file():
                write_atomically(folder / SETTINGS, dumps(settings, indent=1))
            write_atomically(path, dumps(found))


SETTINGS = "settings.json"  # an output root's: the settings its files were measured under
KEPT_KEYS = ("id", *PLACES, "either_by_layer")  # what the report reads of each problem of a kept file


def read_evidence(path: Path) -> dict:
    """The ``training`` section of an rl_evidence results file, with every key this bench reads: its settings and,
    for each model, the evaluation's ``gkv-b<budget>`` cell (problems and their samples' correctness). ValueError
    naming the file and the first key missing (``read_state``: damaged, not JSON)."""
    evidence = read_state(path)
    keys = (
        ("training", "settings", "model"),
        ("training", "settings", "task", "name"),
        ("training", "settings", "task", "sentences"),
        ("training", "settings", "window"),
        ("training", "settings", "interval"),
        ("training", "settings", "train", "budget"),
        *(("training", "settings", "eval", key) for key in ("split", "problems", "seed")),
        ("training", "models"),
    )
    for key in keys:
        value = evidence
        for part in key:
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"--evidence {path} holds no {'.'.join(key)}: not an rl_evidence results file")
            value = value[part]
    training = evidence["training"]
    if not isinstance(training["models"], dict) or not training["models"]:
        raise ValueError(f"--evidence {path}: training.models is not a mapping of models")
    cell = f"gkv-b{training['settings']['train']['budget']}"
    for name, model in training["models"].items():
        found = model.get("cells", {}).get(cell) if isinstance(model, dict) else None
        if not (isinstance(found, dict) and isinstance(found.get("problems"), list) and "correct" in found):
            raise ValueError(f"--evidence {path}: model {name} has no cell {cell} (its problems and correct)")
    return training


def check_output_root(root: Path, settings: dict, names: list[str], ids: list, batch: int) -> None:
    """What ``root`` holds, before any work: its ``settings.json`` equal to ``settings`` (else its files would be
    mixed with other settings'), and every kept file of ``names`` sound and holding its problems (``ids``, in
    batches of ``batch``). ValueError naming the file (``read_state``) and what to do."""
    kept = sorted(root.glob("*-*.json")) if root.is_dir() else []
    if (root / SETTINGS).is_file():
        if read_state(root / SETTINGS) != json.loads(dumps(settings)):
            raise ValueError(
                f"{root} holds measurements of other settings ({root / SETTINGS}): use another --output-root"
            )
    elif kept:
        raise ValueError(f"{root} holds kept files ({kept[0].name}) but no {SETTINGS}: use another --output-root")
    for name in names:
        for start in range(0, len(ids), batch):
            path = root / f"{name}-{start}.json"
            if not path.is_file():
                continue
            rows = read_state(path, list)
            if not all(isinstance(r, dict) and all(k in r for k in KEPT_KEYS) for r in rows):
                raise ValueError(
                    f"{path} is damaged (a problem without {', '.join(KEPT_KEYS)}): remove it to measure it again"
                )
            if [r["id"] for r in rows] != ids[start : start + batch]:
                raise ValueError(
                    f"{path} holds other problems than {ids[start : start + batch]}: use another --output-root"
                )


def check_cells(evidence: dict, path: Path, ids: list) -> None:
    """Every model's ``gkv-b<budget>`` cell holds every problem measured (the report's pass@1 reads them)."""
    cell = f"gkv-b{evidence['settings']['train']['budget']}"
    for name, model in evidence["models"].items():
        missing = [i for i in ids if i not in model["cells"][cell]["problems"]]
        if missing:
            raise ValueError(f"--evidence {path}: model {name}'s cell {cell} lacks problems {missing[:5]}")


def mean(values) -> float:
    return sum(values) / len(values)


def report(evidence: dict, shares: dict[str, list[dict]], settings: dict) -> dict:
    """Per recipe over seeds, the judged differences, shares by layer thirds and pass@1 by held or not."""
    budget = settings["train"]["budget"]
    cell = f"gkv-b{budget}"
    recipes: dict[str, list[str]] = {}
    for name in shares:
        recipes.setdefault(name.split("-s")[0], []).append(name)
    section = {"recipes": {}, "differences": {}}
    for recipe, names in recipes.items():
        entry = {"seeds": len(names)}
        for place in PLACES:
            per_seed = [[r[place] for r in shares[n]] for n in names]
            entry[place] = mean([mean(s) for s in per_seed])
            entry[f"{place}_ci95"] = hierarchical_interval(per_seed)
            entry[f"{place}_per_seed"] = [mean(s) for s in per_seed]
        layers = len(shares[names[0]][0]["either_by_layer"])
        thirds = [range(t * layers // 3, (t + 1) * layers // 3) for t in range(3)]
        entry["either_by_layer_thirds"] = [
            mean([r["either_by_layer"][k] for n in names for r in shares[n] for k in third]) for third in thirds
        ]
        held, empty = [], []
        for n in names:
            correct = evidence["models"][n]["cells"][cell]
            by_id = dict(zip(correct["problems"], correct["correct"]))
            for r in shares[n]:
                (held if r["either"] > 0 else empty).extend(by_id[r["id"]])
        entry["pass@1_when_held"] = [mean(held) if held else None, len(held)]
        entry["pass@1_when_not_held"] = [mean(empty) if empty else None, len(empty)]
        section["recipes"][recipe] = entry
    for mine, theirs in JUDGED:
        if mine in recipes and theirs in recipes:
            first = [[r["either"] for r in shares[n]] for n in recipes[mine]]
            second = [[r["either"] for r in shares[n]] for n in recipes[theirs]]
            section["differences"][f"{mine} minus {theirs}"] = {
                "difference": mean([mean(s) for s in first]) - mean([mean(s) for s in second]),
                "ci95": independent_interval(first, second),
                "seeds": [len(first), len(second)],
            }
    return section


def tables(view: str, result: dict) -> str:
    """Markdown of the results file: ``recipes`` (per recipe over seeds: the shares holding the number in the prompt,
    the story's first sentence, either, and the chance span; by layer thirds; pass@1 by held or not) or
    ``differences`` (the judged ones), with where it came from."""

    def share(entry: dict, place: str) -> str:
        low, high = entry[f"{place}_ci95"]
        return f"{entry[place]:.3f} [{low:.2f}, {high:.2f}]"

    def accuracy(pair: list) -> str:
        return "-" if pair[0] is None else f"{pair[0]:.2f} ({pair[1]})"

    if view == "recipes":
        rows = [
            "| model | seeds | prompt | story | either | chance span | either, per seed "
            "| either by layer thirds, first / "
            "second / last | pass@1 where held (samples) | pass@1 where not held (samples) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, e in result["recipes"].items():
            rows.append(
                f"| {name} | {e['seeds']} | {share(e, 'prompt')} | {share(e, 'story')} | {share(e, 'either')} "
                f"| {share(e, 'control')} | {', '.join(f'{v:.2f}' for v in e['either_per_seed'])} "
                f"| {' / '.join(f'{v:.2f}' for v in e['either_by_layer_thirds'])} "
                f"| {accuracy(e['pass@1_when_held'])} | {accuracy(e['pass@1_when_not_held'])} |"
            )
    else:
        rows = ["| difference in the share holding the number (either place) | seeds | difference |", "|---|---|---|"]
        for name, d in result["differences"].items():
            low, high = d["ci95"]
            mark = " *" if low > 0 or high < 0 else ""
            rows.append(
                f"| {name} | {d['seeds'][0]} and {d['seeds'][1]} "
                f"| {d['difference']:+.3f} [{low:+.2f}, {high:+.2f}]{mark} |"
            )
    return "\n".join(rows) + f"\n\n{provenance(result)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evidence", type=input_file, required=True, help="the rl_evidence results file of the task")
    parser.add_argument("--adapters", type=input_folder, required=True, help="its kept fp16 adapters")
    parser.add_argument("--output-root", type=output_folder, required=True)
    parser.add_argument("--results", type=output_file, help="where the report's section goes")
    parser.add_argument("--batch", type=count, default=32, help="problems per rollout (and per kept file)")
    parser.add_argument("--worker", type=worker, default=(0, 1), help="i/n: every n-th model from the i-th")
    args = parser.parse_args()
    try:  # every input, before any work
        evidence = read_evidence(args.evidence)
        settings, names = evidence["settings"], list(evidence["models"])  # the untrained model, then every run
        config = evaluation_config(settings)
        problems = load_problems(config.data, config.seed)
        ids = list(problems["id"])
        check_cells(evidence, args.evidence, ids)
        mine = names[args.worker[0] :: args.worker[1]]
        adapters = {name: None if name == "untrained" else args.adapters / name for name in mine}
        for adapter in filter(None, adapters.values()):
            check_adapter(str(adapter), config.model)
        root_settings = {"evidence": settings, "batch": args.batch}
        check_output_root(args.output_root, root_settings, names, ids, args.batch)
    except (ValueError, OSError) as err:
        parser.error(" ".join(str(err).split()))
    args.output_root.mkdir(parents=True, exist_ok=True)
    for name, adapter in adapters.items():
        print(f"{name}: measuring", file=sys.stderr, flush=True)
        measure(name, adapter, config, problems, args.batch, args.output_root, root_settings)
    files = {n: [args.output_root / f"{n}-{s}.json" for s in range(0, len(ids), args.batch)] for n in names}
    if not all(p.is_file() for paths in files.values() for p in paths):
        return  # another worker's models are not all in: its run (or a later call) reports
    shares = {n: [r for p in paths for r in read_state(p, list)] for n, paths in files.items()}
    section = {
        "problems": len(ids),
        "budget": settings["train"]["budget"],
        **report(evidence, shares, settings),
        "per_model": {n: {p: mean([r[p] for r in rows]) for p in PLACES} for n, rows in shares.items()},
        **origin(),
    }
    if args.results is not None:
        write_atomically(args.results, dumps(section, indent=1))
    print_json({"bench": "answer_kept", **{k: v for k, v in section.items() if k != "per_model"}})


if __name__ == "__main__":
    main()
