"""Evaluation and generation jobs: generate and grade, pass@k and intervals, reports, teacher traces, the lm-eval
model."""
