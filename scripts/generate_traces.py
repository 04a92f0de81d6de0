"""Teacher traces for offline distillation: full-cache completions, checked, the correct ones written as JSONL.

    python scripts/generate_traces.py --data-name gsm8k --limit 200 --samples 4 --output traces/gsm8k.jsonl
    accelerate launch train.py recipe=distill distill.traces=traces/gsm8k.jsonl

Each line: id, prompt (the problem in the prompt template), completion (text), completion_ids (with the stop
token), answer (gold), correct. Prints one JSON line with the counts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gkv_train.data import PROMPT_TEMPLATE, DataConfig, load_problems
from gkv_train.models import load_model
from gkv_train.traces import generate_traces, write_traces
from rollout.config import SamplingConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the teacher")
    parser.add_argument("--data-name", default="arithmetic", help="preset, built-in task or hub dataset")
    parser.add_argument("--data-path", default=None, help="a local JSONL/JSON/Parquet file instead of --data-name")
    parser.add_argument("--question-field", nargs="+", default=["question"])
    parser.add_argument("--answer-field", default="answer")
    parser.add_argument("--split", default="train")
    parser.add_argument("--levels", type=int, nargs="+", default=[1], help="built-in task levels")
    parser.add_argument("--distractors", type=int, default=0, help="built-in task distractor sentences")
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4, help="completions per problem")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-template", default=PROMPT_TEMPLATE)
    parser.add_argument("--keep-incorrect", action="store_true", help="write wrong completions too")
    parser.add_argument("--output", type=Path, default=Path("outputs/traces.jsonl"))
    args = parser.parse_args()

    name = None if args.data_path else args.data_name
    fields = args.question_field[0] if len(args.question_field) == 1 else args.question_field
    data = DataConfig(
        args.data_path, name, fields, args.answer_field, args.split, args.limit, list(args.levels), args.distractors
    )
    problems = load_problems(data, args.seed)
    model, tokenizer = load_model(args.model)
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        num_samples=args.samples, seed=args.seed,
    )
    rows = generate_traces(model, tokenizer, problems, sampling, args.prompt_template, keep_incorrect=args.keep_incorrect)
    write_traces(rows, args.output)
    correct = sum(r["correct"] for r in rows)
    print(json.dumps({"traces": str(args.output), "problems": len(problems), "samples": len(problems) * args.samples,
                      "written": len(rows), "correct": correct}), flush=True)


if __name__ == "__main__":
    main()
