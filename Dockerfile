# syntax=docker/dockerfile:1
# The image-refresh image for those with a Docker engine (or BuildKit):
#   docker build --build-arg VERSION=0.1.0 -t registry.example.com/ops/image-refresh:0.1.0 .
# Without one, `make image` builds the same binary with ko (.ko.yaml).
# See docs/image.md.

# The Go release the Makefile pins (GOTOOLCHAIN): its standard library has
# the fixes govulncheck needs. test/e2e/image checks the two agree.
ARG GO_VERSION=1.27.3
# distroless static, non-root: CA certificates, tzdata, /etc/passwd with
# nonroot (65532), no shell, no package manager.
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
# Only what the binary is built from: main.go and internal/.
COPY main.go ./
COPY internal/ internal/
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/image-refresh/image-refresh/internal/cli.Version=${VERSION}" \
      -o /out/image-refresh .

FROM ${BASE_IMAGE}
COPY --from=build /out/image-refresh /image-refresh
USER 65532:65532
# The chart runs the image with `args` only: the entrypoint is the binary.
ENTRYPOINT ["/image-refresh"]
