# The two commands a fresh machine needs: `make demo` and `make test`;
# `make examples` runs the runnable examples alone, `make lint` the linters,
# the check that every Go snippet of README.md and docs/ compiles (CI
# runs it too; `make snippets` is that check alone) and the check that
# every file, section and name the docs mention exists (`make doclinks`),
# `make chaos` the fault tests, `make bench` the side-by-side benchmarks and
# `make soak` the soak (docs/performance.md), `make ui` the web view on the
# demo's work, `make browser` the web view's test in a real browser.
# Each that needs a database starts a private, throwaway PostgreSQL unless
# ARBOR_DATABASE_URL is set (see scripts/with-postgres.sh), and removes it
# when it ends: the machine's own (Debian's 15), or the major version
# ARBOR_PG_VERSION names, which the script reads from the environment
# (`ARBOR_PG_VERSION=18 make test`, or `make test ARBOR_PG_VERSION=18`):
# 16, 17 and 18 are fetched once from the npm registry and checked against
# the SHA-512 pinned in the script. `make failover` is 15 only.

GO ?= go
WITH_PG := scripts/with-postgres.sh

.PHONY: test examples chaos failover demo ui browser lint snippets doclinks bench soak generate vet

# The core module and, at the same time, the modules nested in it
# (otelarbor: `go test ./...` at the root does not enter a nested module)
# and machine, on the same server; the output of those run beside is
# printed after the rest. Many tests wait on the database, a lease or a
# timer rather than on the CPU: -p 4 runs four test binaries (or builds)
# at once on this 2-core machine rather than one per core, the slowest
# packages are named first so that they start first, and machine, the
# slowest (over a hundred tests of a few seconds, most of them waiting),
# runs four of its tests at once: 97 s alone rather than 196 s in the
# suite. The other packages keep one test per core: four at once made the
# CPU-bound stress tests of internal/core several times slower beside
# other work. A package's -timeout is the bound of a broken test, not an
# expectation.
NESTED := otelarbor
TESTFLAGS := -race -count=1 -p 4 -timeout 8m
SLOWEST := ./internal/bench/ ./internal/core/ ./cmd/arbor/ ./tasks/

test:
	$(WITH_PG) bash -c 'out=$$(mktemp -d); trap "rm -rf $$out" EXIT; \
		($(GO) test $(TESTFLAGS) -parallel 4 ./machine/ >$$out/machine 2>&1; echo $$? >$$out/machine.rc) & \
		for m in $(NESTED); do (cd $$m && $(GO) test $(TESTFLAGS) ./... >$$out/$$m 2>&1; echo $$? >$$out/$$m.rc) & done; \
		$(GO) test $(TESTFLAGS) $(SLOWEST) $$($(GO) list ./... | grep -v "/machine$$"); rc=$$?; wait; \
		for m in machine $(NESTED); do echo "$$m:"; cat $$out/$$m; [ "$$(cat $$out/$$m.rc)" = 0 ] || rc=1; done; exit $$rc'

# Every runnable example (the Example… functions with // Output:, each on a
# schema of its own) of the core module and the nested ones, and nothing
# else, on one server: what README.md and docs/agents.md point a reader to.
examples:
	$(WITH_PG) bash -c '$(GO) test -count=1 -run "^Example" ./... && \
		for m in $(NESTED); do (cd $$m && $(GO) test -count=1 -run "^Example" ./...) || exit 1; done'

# The fault tests (internal/chaos): runner processes killed (beside a CPU
# hog, during large flushes, under the concurrency limits of three
# tenants, at the creates that start their own turns) and frozen, every backend terminated (also
# beside a CPU hog, with hundreds of abandon_on_restart tasks), the
# database server restarted, a conversation row locked, a node's route
# blackholed, all against a real PostgreSQL. They restart that server, so
# they run only here, on a throwaway server of their own: ARBOR_CHAOS=1 lets
# them run (under `make test` they skip), and with ARBOR_DATABASE_URL set the
# restart test fails rather than restart a server the script did not start.
# -v: the figures of each scenario (overlaps, side effects after a take-over,
# tasks failed, restarts, re-entries of abandon_on_restart handlers,
# give-ups, stop latency; each limit's most runs in flight and slots
# leaked) are the report. The workload, the run log and
# the proof are internal/faultharness's, which the failover tests share.
chaos:
	ARBOR_CHAOS=1 $(WITH_PG) $(GO) test -race -count=1 -timeout 30m -v ./internal/chaos/

# The failover tests (internal/failover): a throwaway pg_auto_failover
# cluster — a monitor, a primary and a synchronous standby, PostgreSQL 15
# from Debian's packages, installed if missing (another ARBOR_PG_VERSION is
# refused) — in a network namespace of
# its own (scripts/with-failover-cluster.sh), reached by a multi-host
# connection string; the primary killed, switched over, cut off, and
# killed during a completer flush and during a prune, with the fault
# proof (internal/faultharness) after each. The modules are fetched
# first: the namespace has no network. -v: the figures (fault → first task
# completed on the new primary, → every conversation settled) are
# docs/operations.md's. The
# suite takes about 5 minutes alone and 11 beside a second make test: the
# package's bound (30m) is for a broken test, not an expectation.
failover:
	$(GO) mod download
	scripts/with-failover-cluster.sh $(GO) test -race -count=1 -timeout 30m -v ./internal/failover/

demo:
	$(WITH_PG) $(GO) run ./cmd/arbor demo

# The web view (docs/ui.md) on a throwaway PostgreSQL: the demo's handlers
# run in the same process on a few of its conversations, actions on (the
# database is thrown away at Ctrl-C). UIFLAGS=--addr=127.0.0.1:9090 moves it.
ui:
	$(WITH_PG) $(GO) run ./cmd/arbor ui --demo --actions $(UIFLAGS)

# The web view driven in a real headless Chromium (arborui/browsertest, a
# module of its own so that chromedp is no dependency of arbor's). Chromium
# comes from Debian's packages, installed if missing (scripts/with-chromium.sh
# skips with a loud message only where the package cannot be had).
# ARBOR_UI_SCREENSHOT=$$PWD/docs/ui.png refreshes the README's screenshot.
BROWSERTEST := arborui/browsertest

browser:
	scripts/with-chromium.sh $(WITH_PG) $(GO) -C $(BROWSERTEST) test -race -count=1 -timeout 10m -v ./...

# Every scenario at its sizes (two per throughput scenario) against the
# ceiling, River, DBOS and, in (h), go-workflows (internal/bench/dbos and
# internal/bench/goworkflows, modules of their own, each built here and run
# as a subprocess; --dbos-dir '' or --goworkflows-dir '' in BENCHFLAGS leaves
# one out), the subjects interleaved in 5 rounds at each size and each
# ratio printed as the median of its per-round ratios with their range, on a throwaway PostgreSQL with fsync on (or ARBOR_DATABASE_URL);
# writes bench-results.json. BENCHFLAGS=--quick for a smoke run; see
# `go run ./cmd/arborbench --help` for sizes, rounds and the rest.
bench:
	$(WITH_PG) $(GO) run ./cmd/arborbench $(BENCHFLAGS)

# The soak (docs/performance.md, "Soak: create, run, prune"): a Runner for
# 4 minutes under a steady load of conversations while the periodic prune
# job deletes what aged out (retention 1 min); the tables and the turns'
# latency sampled every 20 s, and a verdict comparing the last interval with
# the first after the warm-up. Exits non-zero when it is not flat; writes
# bench-results-soak.json. SOAKFLAGS=--soak-duration=10m for longer; see
# `go run ./cmd/arborbench --help` (the --soak-… flags).
soak:
	$(WITH_PG) $(GO) run ./cmd/arborbench --soak $(SOAKFLAGS)

generate:
	$(GO) generate ./...

# staticcheck at a pinned version, fetched from the Go module proxy on first
# use (it is not a dependency of the module); its configuration, with every
# check on, is staticcheck.conf.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: vet snippets doclinks
	@if grep -rnE '^(<<<<<<<|>>>>>>>)( |$$)' --include='*.go' --include='*.md' --include='*.sql' --include='*.sh' --include='Makefile' . ; then \
		echo "lint: merge conflict markers (above)"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...
	for m in $(NESTED) $(BROWSERTEST); do (cd $$m && $(GO) run $(STATICCHECK) ./...) || exit 1; done

# Every ```go block of README.md and docs/ type-checked against arbor as a
# module outside the repository sees it (a require and a replace of arbor
# and otelarbor, as the README says; the module is tidied and built first),
# blocks marked <!-- snippet: skip: why --> left out: internal/cmd/snippets.
snippets:
	$(GO) run ./internal/cmd/snippets

# Every Go file (with its line), design.md section (§N) and Go name of
# arbor's that README.md, docs/ and the code's comments name exists, and
# design.md §3's operation table lists exactly the methods of tasks.Engine,
# machine.Run and machine.Lease: internal/cmd/doclinks, failing at the
# doc's file and line.
doclinks:
	$(GO) run ./internal/cmd/doclinks

vet:
	$(GO) vet ./...
	for m in $(NESTED) $(BROWSERTEST); do (cd $$m && $(GO) vet ./...) || exit 1; done
	@test -z "$$(gofmt -l .)" || (echo "gofmt would change:"; gofmt -l .; exit 1)
