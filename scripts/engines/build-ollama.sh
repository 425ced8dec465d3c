#!/bin/sh
# Builds Ollama (CPU only) from its Go module on the module proxy, and caches
# the binary outside the clone, keyed by version. The module zip lacks the
# vendored C++ headers of its llama.cpp copy; they come from the llama.cpp
# tree that build-llama-server.sh keeps (its path is $1). Prints the binary.
set -eu
version=${OLLAMA_VERSION:-v0.17.4}
llama_src=$1
cache=${KVLOAD_ENGINE_CACHE:-${HOME}/.cache/kvload}/ollama-${version}
bin=$cache/ollama
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
[ -d "$llama_src/vendor" ] || { echo "$llama_src/vendor: missing (build llama-server first)" >&2; exit 1; }
mkdir -p "$cache"
echo "building ollama $version (a few minutes on 2 cores)" >&2
GOBIN="$cache/bin.tmp" CGO_ENABLED=1 CGO_CPPFLAGS="-I$llama_src/vendor" \
	CGO_CFLAGS="-O3 -march=native" CGO_CXXFLAGS="-O3 -march=native" \
	GOFLAGS=-mod=mod go install "github.com/ollama/ollama@$version" >&2
mv "$cache/bin.tmp/ollama" "$bin"
rmdir "$cache/bin.tmp"
echo "$bin"
