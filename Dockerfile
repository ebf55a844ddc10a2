# The one handoff image: webhook, sidecar, prestop, install and inject
# (/handoff), and the sidecar's lighter build (/handoff-sidecar).
# Static binary on distroless's static nonroot base: no shell, no libc,
# user 65532. hack/image writes the same layout without a container engine
# (make image), on an empty base.
#
#   docker build --build-arg VERSION=$(git describe --always) -t handoff .

FROM golang:1.27 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/handoff ./cmd/handoff
# The sidecar's own build, without the webhook and the injector (less
# memory per pod); injected pods run it.
RUN CGO_ENABLED=0 go build -trimpath -tags sidecaronly -ldflags "-s -w -X main.version=${VERSION}" -o /out/handoff-sidecar ./cmd/handoff

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/handoff /handoff
COPY --from=build /out/handoff-sidecar /handoff-sidecar
USER 65532:65532
ENTRYPOINT ["/handoff"]
