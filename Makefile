# The two commands a fresh machine needs: `make demo` and `make test`.
# Each starts a private, throwaway PostgreSQL unless ARBOR_DATABASE_URL is set
# (see scripts/with-postgres.sh), and removes it when it ends.

GO ?= go
WITH_PG := scripts/with-postgres.sh

.PHONY: test demo bench generate vet

test:
	$(WITH_PG) $(GO) test -race -count=1 -timeout 20m ./...

demo:
	$(WITH_PG) $(GO) run ./cmd/arbor demo

generate:
	$(GO) generate ./...

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
