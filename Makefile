# The two commands of the README: `make run` and `make test`. Both set up first (idempotent).
SHELL := /bin/bash
WORKSPACE ?= workspace
OPFORGE := ./build/opforge

.PHONY: setup run test clean
setup:
	@scripts/setup.sh

run: setup
	$(OPFORGE) crawl --workspace $(WORKSPACE)
	$(OPFORGE) status --workspace $(WORKSPACE)

test: setup
	cd build && ctest --output-on-failure -L cpu --timeout 1200

clean:
	rm -rf build
