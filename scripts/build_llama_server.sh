#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from source and cache the binary, like scripts/setup.sh caches the
# llama-cpp-python wheel. An explicit set-up step (`make llama-server`), never a side effect of pip install.
#
# Source: the llama.cpp vendored in the llama-cpp-python $LLAMA_CPP_VERSION sdist (the same llama.cpp the
# wheel is built from, so the server and the in-process backend run the same code), fetched with pip and
# cached in $SURPRISEGATE_SRC (default ~/.cache/surprisegate/src).
# CPU flags: the SAME as the wheel. setup.sh builds the wheel with -DGGML_NATIVE=OFF; in ggml's CMake that
# (with GGML_NATIVE_DEFAULT=ON, i.e. no cross-compiling and no SOURCE_DATE_EPOCH) switches INS_ENB on, which
# turns on SSE4.2, AVX, AVX2, BMI2, FMA and F16C (AVX-512 and AVX-VNNI stay off). We spell those out so
# the build does not depend on the environment: a portable build without AVX2 decodes about 4x slower.
# Only the llama-server target is built (no tests, no examples, no curl, no OpenSSL, no web UI download),
# statically linked against ggml/llama so the cached file is one self-contained binary.
#
# Output: $SURPRISEGATE_BIN/llama-server (default ~/.cache/surprisegate/bin), plus llama-server.stamp
# (version and flags). Skipped when a binary with the same stamp is already cached; FORCE=1 rebuilds.
# About 7.5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36}
BIN_DIR=${SURPRISEGATE_BIN:-$HOME/.cache/surprisegate/bin}
SRC_DIR=${SURPRISEGATE_SRC:-$HOME/.cache/surprisegate/src}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON
           -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
STAMP="llama-cpp-python==$LLAMA_CPP_VERSION ${CPU_FLAGS[*]}"
DEST="$BIN_DIR/llama-server"

if [ "${FORCE:-0}" != 1 ] && [ -x "$DEST" ] && [ -f "$DEST.stamp" ] && [ "$(cat "$DEST.stamp")" = "$STAMP" ]; then
  echo "build_llama_server: cached $DEST ($STAMP)" >&2
  exit 0
fi

# No system cmake: the PyPI package (the same one the wheel build pulls in) into .venv.
if ! command -v cmake >/dev/null 2>&1 && [ -x .venv/bin/python ]; then
  echo "build_llama_server: no cmake on PATH; installing it from PyPI into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check cmake && export PATH="$PWD/.venv/bin:$PATH"
fi
for tool in cmake c++; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build_llama_server: '$tool' not found; install cmake and a C++ compiler (apt-get install cmake g++)" >&2; exit 1; }
done

start=$(date +%s)
mkdir -p "$BIN_DIR" "$SRC_DIR"
sdist="$SRC_DIR/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  echo "build_llama_server: downloading the llama-cpp-python $LLAMA_CPP_VERSION sdist (its vendored llama.cpp) ..." >&2
  "$PYTHON" -m pip --disable-pip-version-check -q download --no-binary :all: --no-deps \
    -d "$SRC_DIR" "llama-cpp-python==$LLAMA_CPP_VERSION"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "build_llama_server: no vendor/llama.cpp in $sdist" >&2; exit 1; }

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
echo "build_llama_server: configuring (${CPU_FLAGS[*]}) ..." >&2
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  "${CPU_FLAGS[@]}" -DGGML_CCACHE=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  >"$work/configure.log" 2>&1 || { tail -n 40 "$work/configure.log" >&2; exit 1; }
echo "build_llama_server: building llama-server with $JOBS jobs (about 7.5 minutes on 2 cores) ..." >&2
cmake --build "$work/build" --target llama-server -j "$JOBS" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; exit 1; }

built=$(find "$work/build" -type f -name llama-server -perm -u+x | head -n1)
[ -n "$built" ] || { echo "build_llama_server: the build produced no llama-server binary" >&2; exit 1; }
install -m 0755 "$built" "$DEST.tmp"
mv -f "$DEST.tmp" "$DEST"
printf '%s\n' "$STAMP" >"$DEST.stamp"
echo "build_llama_server: built $DEST in $(( $(date +%s) - start )) s" >&2
"$DEST" --version 2>&1 | head -n 2 >&2 || true
