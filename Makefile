# The two commands of the README: `make run` and `make test`. Both set up first (idempotent).
SHELL := /bin/bash
WORKSPACE ?= workspace
OPFORGE := ./build/opforge

.PHONY: setup run test test-ecosystem clean
setup:
	@scripts/setup.sh

PRESET ?= default
# The whole pipeline on the default preset (data/presets/default.json); stdout names the export.
run: setup
	@out=$$($(OPFORGE) run --workspace $(WORKSPACE) --preset $(PRESET)) && \
	  echo "opforge: shards, manifest.json, dataset card README.md and stats/ are in $$out"

test: setup
	cd build && ctest --output-on-failure -L cpu --timeout 1200 -j$$(nproc)

# The RL frameworks' own code calling opforge's reward, each with its own pinned packages (not
# part of make test).
test-ecosystem: setup
	bash scripts/test_ecosystem.sh

clean:
	rm -rf build
