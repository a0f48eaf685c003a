package chaos

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/arborhq/arbor/internal/testdb"
)

// envChaos lets the tests run: only `make chaos` sets it, on a server of
// its own.
const envChaos = "ARBOR_CHAOS"

// The test binary doubles as a runner process: re-executed with envChild
// set, it runs a Runner with the workload's handlers (see child_test.go);
// with envHog, it is a CPU hog.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(runChild())
	}
	if v := os.Getenv(envHog); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			fmt.Fprintln(os.Stderr, envHog, v, err)
			os.Exit(1)
		}
		os.Exit(runHog(n))
	}
	os.Exit(testdb.Main(m))
}

// requireChaos skips the test unless `make chaos` runs it. These tests
// restart the database server and terminate its backends: on the server
// that `make test` shares among every package's tests, they would break
// the others.
func requireChaos(t *testing.T) {
	t.Helper()
	if os.Getenv(envChaos) != "1" {
		t.Skip("CHAOS TESTS SKIPPED: they kill runners, terminate backends and restart the database server; run them with `make chaos` (ARBOR_CHAOS=1, a throwaway PostgreSQL of their own)")
	}
}
