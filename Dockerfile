# syntax=docker/dockerfile:1
#
# One image with every converge binary: writer, relay, projector-index,
# projector-graph, notifier and the operator CLI converge. docker-compose.yml runs each
# service from it by naming the binary as the command.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, in their own layer: editing the source does not download
# them again.
COPY go.mod go.sum ./
RUN go mod download
# Only what the binaries are built from: no build output, local data or
# credentials from the working tree reach the image.
COPY api ./api
COPY cmd ./cmd
COPY internal ./internal
COPY migrations ./migrations
COPY pkg ./pkg
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/...

# Alpine rather than distroless so that healthchecks have a shell and an
# HTTP client to ask each service's /readyz: curl, since the listeners are
# https with the stack's own CA (docker-compose.yml), which curl verifies
# with --cacert and busybox wget cannot be given.
FROM alpine:3.22
RUN apk add --no-cache curl \
 && addgroup -S -g 10001 converge \
 && adduser -S -D -H -u 10001 -G converge -s /sbin/nologin converge \
 && mkdir -p /var/lib/converge \
 && chown converge:converge /var/lib/converge
COPY --from=build /out/ /usr/local/bin/
# Where the embedded index and graph keep their files when a projector is
# given no Qdrant or Neo4j URL (docker-compose.yml gives both).
ENV CONVERGE_DATA_DIR=/var/lib/converge
WORKDIR /var/lib/converge
USER 10001:10001
CMD ["converge", "help"]
