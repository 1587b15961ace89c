# The two entry points of the README. Everything they need is installed by the scripts below.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test setup setup-system engine images check unit mutation

## Set everything up on a fresh machine and run the appliance on its embedded default (CPU engine).
up: setup engine
	$(BIN)/appliance up

## Set everything up and run the whole test suite (what .ci/run runs).
test: setup setup-system engine
	bash scripts/start-dockerd.sh
	PYTHON=$(BIN)/python bash scripts/build-images.sh
	$(MAKE) check
	$(BIN)/python -m pytest -ra --durations=40 tests/integration
	BIN=$(BIN) bash scripts/ci-beside-appliance.sh  # the unit suite, beside a running appliance

setup:
	bash scripts/setup.sh $(VENV)

setup-system:
	bash scripts/setup-system.sh

engine: setup
	$(BIN)/appliance engine setup

## The appliance's images (appliance, cpu-vllm, prometheus); skips those whose inputs did not change.
images: setup
	bash scripts/start-dockerd.sh
	PYTHON=$(BIN)/python bash scripts/build-images.sh

check:
	$(BIN)/ruff check appliance host_setup controller tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: setup
	$(BIN)/python -m pytest -q -n auto tests/unit

## Mutation testing of the pure decision modules (docs/mutation-testing.md). Slow, so not part of
## `make test` or CI: run it by hand after changing one of them. MUTANTS narrows it to some modules
## (mutmut name globs, e.g. MUTANTS='appliance.recipe.admission*'); MUTATION_JOBS caps the workers.
MUTANTS ?=
MUTATION_JOBS ?= $(shell nproc)
mutation: setup
	rm -rf mutants
	$(BIN)/python scripts/mutation.py run --max-children $(MUTATION_JOBS) $(MUTANTS)
	$(BIN)/python scripts/mutation.py results
