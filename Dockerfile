# The lab as a small, non-root container image.
#   docker build -t idempotency-lab .
#   docker compose -f compose.go.yml up --build   (three replicas + front)

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static binary (no cgo) so it runs on distroless/static without libc.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/lab ./cmd/lab

# distroless/static: no shell, no package manager, just CA certs and tzdata.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/lab /lab
USER nonroot:nonroot
EXPOSE 8616
# Listen beyond loopback, and never fall back to embedded services: in a
# container PostgreSQL and Redis come from DATABASE_URL and REDIS_URL.
ENV LAB_ADDR=0.0.0.0:8616 LAB_EMBEDDED_POSTGRES=off LAB_EMBEDDED_REDIS=off
# No curl in the image: the binary checks its own /health.
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=5 CMD ["/lab", "health"]
ENTRYPOINT ["/lab"]
CMD ["serve"]
