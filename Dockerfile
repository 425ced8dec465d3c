# kvload-exporter container image: a static binary on distroless, running as
# nonroot, with the bundled example traces and a default configuration that
# replays one of them against an engine emulated inside the exporter.
#
#   docker build -t kvload-exporter \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg BRANCH=$(git rev-parse --abbrev-ref HEAD) \
#     --build-arg BUILD_DATE=$(date -u +%Y%m%d-%H:%M:%S) .
#   docker run --rm -p 9812:9812 kvload-exporter
#
# Your own configuration: mount a directory holding kvload.yml over
# /etc/kvload (a directory, not the single file, so that edits are seen and
# reloaded); traces go anywhere the configuration names, such as
# /usr/share/kvload/traces or a mounted volume.

ARG GO_IMAGE=golang:1.26
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS builder
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY collector/ collector/
COPY config/ config/
COPY engine/ engine/
COPY emulate/ emulate/
COPY internal/ internal/
COPY idealcache/ idealcache/
COPY kvevents/ kvevents/
COPY lifecycle/ lifecycle/
COPY openai/ openai/
COPY prompt/ prompt/
COPY replay/ replay/
COPY rowrequest/ rowrequest/
COPY servedcache/ servedcache/
COPY synth/ synth/
COPY tokenizer/ tokenizer/
COPY trace/ trace/
COPY tracing/ tracing/
ARG VERSION=dev
ARG REVISION=unknown
ARG BRANCH=unknown
ARG BUILD_DATE=unknown
ARG BUILD_USER=docker
ARG TARGETOS=linux
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
      -ldflags "-s -w \
        -X github.com/prometheus/common/version.Version=${VERSION} \
        -X github.com/prometheus/common/version.Revision=${REVISION} \
        -X github.com/prometheus/common/version.Branch=${BRANCH} \
        -X github.com/prometheus/common/version.BuildDate=${BUILD_DATE} \
        -X github.com/prometheus/common/version.BuildUser=${BUILD_USER}" \
      -o /out/kvload-exporter ./cmd/kvload-exporter

FROM ${BASE_IMAGE}
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kvload-exporter" \
      org.opencontainers.image.description="Replays Mooncake LLM request traces against OpenAI-compatible inference servers and exports latency and prefix-cache metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=builder /out/kvload-exporter /bin/kvload-exporter
COPY examples/traces/ /usr/share/kvload/traces/
COPY examples/compose/exporter/kvload.yml /etc/kvload/kvload.yml
USER nonroot:nonroot
EXPOSE 9812
ENTRYPOINT ["/bin/kvload-exporter", "--config.file=/etc/kvload/kvload.yml"]
