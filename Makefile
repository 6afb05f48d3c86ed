# The two commands of the README. Both set up .venv first (idempotent; the llama.cpp wheel is cached).
.PHONY: setup demo test test-fast bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/surprisegate demo

test: setup
	.venv/bin/python -m pytest -q

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"

bench: setup
	.venv/bin/surprisegate bench decode --json
	.venv/bin/surprisegate bench rewind --json
