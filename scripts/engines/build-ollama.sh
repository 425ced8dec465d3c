#!/bin/sh
# Builds Ollama (CPU only) from its Go module on the module proxy, and caches
# it outside the clone, keyed by version, laid out as Ollama's Linux packages
# are: bin/ollama, and lib/ollama/ for what it runs. $1 is the llama-server
# binary that build-llama-server.sh built. Prints the ollama binary's path.
#
# Releases since v0.30 run llama.cpp's llama-server as a subprocess, looked
# up in lib/ollama/, and their module holds no C++: Ollama's own build
# fetches llama.cpp with CMake, which this machine cannot reach, so the
# llama-server built from node-llama-cpp's source goes there instead. It
# lacks Ollama's patches, which only translate models published on Ollama's
# registry; a GGUF imported with `ollama create` needs none.
# Older releases link their own copy of llama.cpp with cgo; the module zip
# lacks its vendored C++ headers, which come from the llama.cpp tree kept
# beside llama-server (src/vendor).
set -eu
version=${OLLAMA_VERSION:-v0.34.4}
llama_server=$1
cache=${KVLOAD_ENGINE_CACHE:-${HOME}/.cache/kvload}/ollama-${version}
bin=$cache/bin/ollama
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
[ -x "$llama_server" ] || { echo "$llama_server: missing (build llama-server first)" >&2; exit 1; }
module=github.com/ollama/ollama@$version
src=$(cd / && GOFLAGS=-mod=mod go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "$module: not downloaded" >&2; exit 1; }
mkdir -p "$cache"
start=$(date +%s)
echo "building ollama $version (a few minutes on 2 cores)" >&2
if [ -f "$src/llm/llama_server.go" ]; then
	GOBIN="$cache/bin.tmp" CGO_ENABLED=1 GOFLAGS=-mod=mod go install "$module" >&2
	mkdir -p "$cache/lib/ollama"
	cp "$llama_server" "$cache/lib/ollama/llama-server.tmp"
	mv "$cache/lib/ollama/llama-server.tmp" "$cache/lib/ollama/llama-server"
else
	vendor=$(dirname "$llama_server")/src/vendor
	[ -d "$vendor" ] || { echo "$vendor: missing (build llama-server first)" >&2; exit 1; }
	GOBIN="$cache/bin.tmp" CGO_ENABLED=1 CGO_CPPFLAGS="-I$vendor" \
		CGO_CFLAGS="-O3 -march=native" CGO_CXXFLAGS="-O3 -march=native" \
		GOFLAGS=-mod=mod go install "$module" >&2
fi
mkdir -p "$cache/bin"
mv "$cache/bin.tmp/ollama" "$bin"
rmdir "$cache/bin.tmp"
echo "built ollama $version in $(($(date +%s) - start)) s" >&2
echo "$bin"
