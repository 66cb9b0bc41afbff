# Everything from a fresh clone, on a machine that has only the Python named:
#   make run                        set up .venv (Python 3.11, the pinned stack) and train DQN on CartPole
#   make test                       set up .venv and run every test, then list the 15 slowest
#   make run  PYTHON=python3.12     the same on the current stack (newest TensorFlow, tf-keras), in .venv-current
#   make test PYTHON=python3.12
#   make test-fast                  the fast subset (tests not marked slow), for development
#   make coverage                   every test on both stacks under coverage.py: line and branch coverage of tfbuffers/
#   make mutations                  the deliberate bugs of scripts/mutations.py, each must make a test fail
#   make notebooks                  every notebook in a Jupyter kernel at the sizes it ships with (pinned stack; make test: small)
#   make docs                       the documentation site with its API reference, into site/ (warnings are errors)
#   make run ARGS="--seed 1"        train_dqn.py's options; make test PYTEST_ARGS="tests/contract_test.py": pytest's
#   make flashbax-env               .venv-flashbax: Flashbax (JAX) for the benchmark's Flashbax peer, apart from TensorFlow
#   make torchrl-env                .venv-torchrl: TorchRL (PyTorch on the CPU) for the benchmark's TorchRL peer, likewise
# A venv is set up again when setup.cfg or the stack's constraints file changes.
PYTHON ?= python3.11
STACK := $(shell $(PYTHON) -c 'import sys; print("pinned" if sys.version_info[:2] == (3, 11) else "current")')
ifeq ($(STACK),pinned)
VENV ?= .venv
CONSTRAINTS := constraints.txt
AGENTS :=
else
VENV ?= .venv-current
CONSTRAINTS := constraints-current.txt
# TF-Agents 0.19's own pins do not install past Python 3.11; the 'agents' extra brought what it needs.
AGENTS := $(VENV)/bin/pip install -q -c $(CONSTRAINTS) --no-deps tf-agents==0.19.0
endif
PYTEST_ARGS ?=
ARGS ?=

.PHONY: setup run test test-fast coverage mutations notebooks docs flashbax-env torchrl-env

setup: $(VENV)/.installed

$(VENV)/.installed: setup.cfg $(CONSTRAINTS)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -c $(CONSTRAINTS) -e ".[all,test,dev]"
	$(AGENTS)
	touch $@

run: setup
	$(VENV)/bin/python scripts/train_dqn.py $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest --durations=15 $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

# Both stacks' runs combined (.coverage), the report printed and written to coverage.json. PYTHON_CURRENT names the
# current stack's interpreter.
PYTHON_CURRENT ?= python3.12
coverage:
	$(MAKE) setup PYTHON=python3.11
	$(MAKE) setup PYTHON=$(PYTHON_CURRENT)
	rm -f .coverage .coverage.*
	COVERAGE_FILE=.coverage.pinned .venv/bin/python -m pytest --cov --cov-report= $(PYTEST_ARGS)
	COVERAGE_FILE=.coverage.current .venv-current/bin/python -m pytest --cov --cov-report= $(PYTEST_ARGS)
	.venv/bin/coverage combine --keep .coverage.pinned .coverage.current
	.venv/bin/coverage report
	.venv/bin/coverage json -q -o coverage.json

mutations: setup
	$(VENV)/bin/python scripts/mutations.py $(ARGS)

notebooks: setup
	$(VENV)/bin/python -m pytest --full-size-notebooks tests/project/colabs_test.py -k in_a_kernel $(PYTEST_ARGS)

docs: setup
	$(VENV)/bin/mkdocs build --strict

flashbax-env: .venv-flashbax/.installed

.venv-flashbax/.installed: scripts/flashbax-requirements.txt
	rm -rf .venv-flashbax
	$(PYTHON) -m venv .venv-flashbax
	.venv-flashbax/bin/pip install -q --disable-pip-version-check -r scripts/flashbax-requirements.txt
	touch $@

# TorchRL's wheel, then its C++ extension built against the pinned CPU torch (scripts/_torchrl_extension.py says why).
torchrl-env: .venv-torchrl/.installed

.venv-torchrl/.installed: scripts/torchrl-requirements.txt scripts/_torchrl_extension.py
	rm -rf .venv-torchrl
	$(PYTHON) -m venv .venv-torchrl
	.venv-torchrl/bin/pip install -q --disable-pip-version-check -r scripts/torchrl-requirements.txt
	.venv-torchrl/bin/python scripts/_torchrl_extension.py
	touch $@
