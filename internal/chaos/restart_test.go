package chaos

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// envPgCtl is the command prefix that restarts the server, which only
// scripts/with-postgres.sh exports, and only for a server it started.
const envPgCtl = "ARBOR_PG_CTL"

// TestRestartedServer (c): two runner processes; the database server is
// restarted twice at random moments (after 150 to 299 more handler calls),
// first with `pg_ctl restart -m fast` (clients disconnected, a clean
// shutdown), then with `-m immediate` (no shutdown checkpoint: crash
// recovery at start, COMMITs in flight lost or not). No runner process
// dies: nothing may fail, nothing may be restarted (every task's attempt
// stays 0), and every turn completes with its result.
func TestRestartedServer(t *testing.T) {
	requireChaos(t)
	pgCtl := os.Getenv(envPgCtl)
	if pgCtl == "" {
		t.Fatalf("chaos (c) restarts the database server, so it needs the throwaway PostgreSQL that scripts/with-postgres.sh starts itself (it exports %s); "+
			"it is not set, because ARBOR_DATABASE_URL was given from outside or the script did not run: run `make chaos` without ARBOR_DATABASE_URL", envPgCtl)
	}
	s := setup(t, conversations)
	s.startChild("c1", leaseDefault)
	s.startChild("c2", leaseDefault)
	from := s.Runs()
	for i, mode := range []string{"fast", "immediate"} {
		from = s.WaitProgress(from, 150+s.rng.IntN(150))
		require.False(t, s.Done(), "restart %d: the work was done before it; the workload is too small", i+1)
		live := s.Live()
		at := time.Now()
		out, err := exec.Command("bash", "-c", pgCtl+" restart -m "+mode+" -w -t 60").CombinedOutput()
		require.NoError(t, err, "pg_ctl restart -m %s: %s", mode, out)
		// A run of an abandon_on_restart task that the restart cut (its
		// node stopped its handler when it could not renew its lease
		// through the restart) is abandoned, as a crash's would be: its
		// call may have been made. That is the restart's doing; a restart
		// counted as one (attempt + 1) is not, and the proof still refuses
		// it (docs/design.md §3.8).
		s.Fault("restart", "", "", at, time.Now().Add(leaseDefault))
		t.Logf("restarted the server (-m %s) with %d tasks live, after %d handler calls", mode, live, from)
		from = s.Runs()
	}
	s.WaitSettled()
	s.stopAll()
	s.Verify()
}
