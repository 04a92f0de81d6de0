"""Teacher traces for offline distillation: full-cache completions, checked, the correct ones written as JSONL
(Hydra, like train.py and evaluate.py; keys: ``gkv_train.config.eval_config.TracesConfig``).

    python scripts/generate_traces.py data.name=gsm8k data.split=test data.limit=200 num_generations=4 \
        output=traces/gsm8k.jsonl
    accelerate launch train.py recipe=distill distill.traces=traces/gsm8k.jsonl

Each line: id, prompt (the problem in the prompt template ``data.prompt_template``), completion (text),
completion_ids (with the stop token), answer (gold), correct, check_timed_out / check_error (the answer check gave
no verdict). Prints one JSON line with the counts (the answer checks' ``verifier_*`` too). The output file is
locked for the call: a second call writing it is refused.
"""

from gkv_train.cli import traces

if __name__ == "__main__":
    traces()  # the same as `gkv-train traces ...`
