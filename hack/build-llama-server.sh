#!/usr/bin/env bash
# Build llama.cpp's llama-server (the engine peer of `make bench-runtime`), once, cached by version:
#   $CHATFLEET_CACHE/bin/llama-cpp-<version>/llama-server      the OpenAI-compatible server (-np, -cb)
#   $CHATFLEET_CACHE/bin/llama-cpp-<version>/convert_hf_to_gguf.py, conversion/, gguf-py/  (HF folder -> GGUF)
#   $CHATFLEET_CACHE/bin/llama-cpp-<version>/pydeps/  sentencepiece, which the converter imports for Qwen2
#     (installed there, not into the project's venv; the converter runs with PYTHONPATH set to these)
# The source is llama-cpp-python's source package, which carries the whole llama.cpp tree under
# vendor/llama.cpp. Only the llama-server target is built (Release, native CPU flags, no curl, no TLS,
# no web UI download): cold 30 min on the 2 shared cores at nice 10 (2026-11-27, other builds and tests
# running; the source package download took 1.5 min). Bench only, never part of `make test`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
v=$LLAMA_CPP_PYTHON_VERSION
CACHE=${CHATFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chatfleet}
PY=${PY:-$here/../.venv/bin/python}
out="$CACHE/bin/llama-cpp-$v" d="$CACHE/build/llama-cpp-$v"
say() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

[ -x "$out/llama-server" ] && [ -f "$out/convert_hf_to_gguf.py" ] && [ -d "$out/pydeps" ] && { say "llama-server (llama-cpp-python $v) cached"; exit 0; }
command -v cmake >/dev/null 2>&1 || die "cmake is missing (it builds llama-server)"
mkdir -p "$d"
if [ ! -d "$d/llama_cpp_python-$v/vendor/llama.cpp" ]; then
  say "downloading the llama-cpp-python $v source package"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$v" -d "$d" \
    || die "cannot download llama-cpp-python==$v from the Python package registry"
  tar -xzf "$d/llama_cpp_python-$v.tar.gz" -C "$d"
fi
src="$d/llama_cpp_python-$v/vendor/llama.cpp"
say "building llama-server from $src (cold: up to 30 min on 2 busy cores)"
cmake -S "$src" -B "$d/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >/dev/null
nice -n 10 cmake --build "$d/build" -j2 --target llama-server
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cp "$d/build/bin/llama-server" "$out.tmp/"
cp "$src/convert_hf_to_gguf.py" "$out.tmp/"
cp -r "$src/gguf-py" "$out.tmp/gguf-py"
[ -d "$src/conversion" ] && cp -r "$src/conversion" "$out.tmp/conversion"
"$PY" -m pip install -q --target "$out.tmp/pydeps" sentencepiece \
  || die "cannot install sentencepiece from the Python package registry (the GGUF converter needs it)"
rm -rf "$out" && mv "$out.tmp" "$out"
say "llama-server ready: $out/llama-server"
