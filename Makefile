# Fresh machine: `make run` (set up, then the live chat UI on the default model) or `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
MLXSPEC := $(VENV)/bin/mlxspec
PROMPT ?= Write a short Python function that checks whether a number is prime, then explain it.

.PHONY: setup system-deps draft-data-deps venv model run generate test test-fast test-cuda bench clean

setup: system-deps venv model

# MLX on Linux CPU needs the system OpenBLAS (40x faster than the wheel's reference BLAS).
system-deps:
	@if [ "$$(uname)" = "Linux" ] && ! ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0'; then \
		echo "installing system OpenBLAS (libopenblas0-pthread)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libopenblas0-pthread; \
	fi

# Openly licensed text for the draft-training corpus (mlxspec/training/SOURCES.md); not part of setup.
DRAFT_DATA_PKGS := python3.11-doc wordnet-base fortunes manpages-de
draft-data-deps:
	@if [ "$$(uname)" = "Linux" ] && command -v apt-get >/dev/null; then \
		echo "installing draft-training text ($(DRAFT_DATA_PKGS))"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(DRAFT_DATA_PKGS); \
	else echo "draft-data-deps needs Debian/Ubuntu apt-get; the corpus skips missing sources"; fi

venv: $(VENV)/.installed

# The torch extra (--backend torch, `mlxspec parity`) is part of setup so `make test` runs the
# CPU parity tests. TORCH pins the CPU build this machine kind keeps on disk (a plain `torch`
# on Linux x86-64 downloads a CUDA build of several GB); on a Mac the same pin gives MPS.
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,torch]" "$(TORCH)"
	touch $@

model: venv
	$(MLXSPEC) models pull

run: setup
	$(MLXSPEC) chat

# The same engine without the UI: stream one answer to stdout.
generate: setup
	$(MLXSPEC) generate "$(PROMPT)" --max-tokens 128

test: setup
	$(PY) -m pytest -q --durations=15

test-fast: venv
	$(PY) -m pytest -q -m "not model"

# On a machine with an NVIDIA GPU (and TORCH=torch, a CUDA build): the CUDA parity tests.
test-cuda: setup
	$(PY) -m pytest -q -m cuda -rs

bench: setup
	$(MLXSPEC) bench --baseline --out out/bench-baseline.json

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
