package failover

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// What scripts/with-failover-cluster.sh exports: the monitor's database,
// the data nodes ("a=5431 b=5432"), the command prefix that acts on the
// cluster, and whether it may cut a node's network.
const (
	envCtl     = "ARBOR_FAILOVER_CTL"
	envMonitor = "ARBOR_FAILOVER_MONITOR_URL"
	envNodes   = "ARBOR_FAILOVER_NODES"
	envCut     = "ARBOR_FAILOVER_CUT"
)

// cluster is the pg_auto_failover cluster the tests run on.
type cluster struct {
	t       *testing.T
	ctl     string
	monitor string
	ports   map[string]int // data node → port
}

// nodeState is a data node as the monitor sees it: the state its keeper
// reported last, and the one the monitor assigned.
type nodeState struct{ reported, goal string }

// requireCluster skips the test unless `make failover` runs it on a
// cluster of its own.
func requireCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, ctl: os.Getenv(envCtl), monitor: os.Getenv(envMonitor), ports: map[string]int{}}
	if c.ctl == "" || c.monitor == "" {
		t.Skip("FAILOVER TESTS SKIPPED: they kill, switch over and cut off the primary of a pg_auto_failover cluster; run them with `make failover` (scripts/with-failover-cluster.sh starts a throwaway one)")
	}
	for _, kv := range strings.Fields(os.Getenv(envNodes)) {
		name, port, ok := strings.Cut(kv, "=")
		p, err := strconv.Atoi(port)
		require.True(t, ok && err == nil, "%s: %q", envNodes, kv)
		c.ports[name] = p
	}
	require.Len(t, c.ports, 2, "%s names two data nodes", envNodes)
	return c
}

// do runs an action of scripts/with-failover-cluster.sh's ctl on the
// cluster (kill, start, switchover, cut, heal).
func (c *cluster) do(args ...string) string {
	c.t.Helper()
	out, err := exec.Command("bash", "-c", c.ctl+" "+strings.Join(args, " ")).CombinedOutput()
	require.NoError(c.t, err, "ctl %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// switchover performs a planned switchover and waits for its end. The
// monitor's perform_failover can fail with a deadlock against a keeper's
// report (both update pgautofailover.node): then its transaction rolled
// back, nothing was assigned, and it is tried again.
func (c *cluster) switchover() error {
	for try := 1; ; try++ {
		out, err := exec.Command("bash", "-c", c.ctl+" switchover").CombinedOutput()
		if err == nil {
			return nil
		}
		if !strings.Contains(string(out), "deadlock detected") || try == 5 {
			return fmt.Errorf("ctl switchover (try %d): %v: %s", try, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// states reads the monitor's view of the data nodes.
func (c *cluster) states() (map[string]nodeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.monitor)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, `SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node`)
	if err != nil {
		return nil, err
	}
	out := map[string]nodeState{}
	for rows.Next() {
		var name string
		var st nodeState
		if err := rows.Scan(&name, &st.reported, &st.goal); err != nil {
			return nil, err
		}
		out[name] = st
	}
	return out, rows.Err()
}

// waitFor polls the monitor until cond holds on its view, and returns the
// view; the bound is for a broken cluster.
func (c *cluster) waitFor(what string, cond func(map[string]nodeState) bool) map[string]nodeState {
	c.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var last map[string]nodeState
	var lastErr error
	for time.Now().Before(deadline) {
		st, err := c.states()
		if err == nil && cond(st) {
			return st
		}
		last, lastErr = st, err
		time.Sleep(50 * time.Millisecond) // a poll of the monitor
	}
	c.t.Fatalf("cluster: timed out waiting for %s; monitor: %v (%v)\nmonitor events:\n%s", what, last, lastErr, c.events())
	return nil
}

// healthy waits until one node is the primary with the other its
// synchronous standby, and returns the primary: where every scenario
// starts.
func (c *cluster) healthy() string {
	c.t.Helper()
	var primary string
	c.waitFor("a primary and a secondary", func(st map[string]nodeState) bool {
		primary = ""
		n := 0
		for name, s := range st {
			switch {
			case s.reported == "primary" && s.goal == "primary":
				primary = name
				n++
			case s.reported == "secondary" && s.goal == "secondary":
				n++
			}
		}
		return primary != "" && n == 2
	})
	// The monitor's states say the keepers finished their transitions, not
	// that the primary's commits wait for the standby: a keeper's change
	// of synchronous_standby_names is a reload, and the walsender turns
	// synchronous once the standby streams. A scenario that began before
	// would run on asynchronous replication, where a failover may lose
	// commits the primary acknowledged: the cluster's loss, not arbor's.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := exec.Command("bash", "-c", c.ctl+" sql "+primary+" "+shellQuote(syncInForce)).CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "t" {
			return primary
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster: %s's commits never waited for a synchronous standby: %s %v\nmonitor events:\n%s", primary, out, err, c.events())
		}
		time.Sleep(50 * time.Millisecond) // a poll of the primary
	}
}

// syncInForce is true on a primary whose commits wait for a standby now.
const syncInForce = `SELECT current_setting('synchronous_standby_names') <> '' AND EXISTS (SELECT 1 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))`

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// events is the monitor's history of the data nodes' states, newest last:
// what a failed scenario's report shows of the cluster.
func (c *cluster) events() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.monitor)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, `SELECT to_char(eventtime, 'HH24:MI:SS.MS'), nodename, reportedstate::text, goalstate::text, coalesce(reportedrepstate, ''), coalesce(description, '')
		FROM (SELECT * FROM pgautofailover.event ORDER BY eventid DESC LIMIT 60) e ORDER BY eventid`)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for rows.Next() {
		var at, node, rep, goal, repstate, desc string
		if err := rows.Scan(&at, &node, &rep, &goal, &repstate, &desc); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "%s %s reported %s goal %s (replication %s): %s\n", at, node, rep, goal, repstate, desc)
	}
	if err := rows.Err(); err != nil {
		return err.Error()
	}
	return b.String()
}

// promoted waits until a node other than old is a primary (wait_primary,
// while the old one is not its standby yet), and returns it.
func (c *cluster) promoted(old string) string {
	c.t.Helper()
	var name string
	c.waitFor("a node other than "+old+" promoted", func(st map[string]nodeState) bool {
		for n, s := range st {
			if n != old && (s.reported == "wait_primary" || s.reported == "primary") && s.reported == s.goal {
				name = n
				return true
			}
		}
		return false
	})
	return name
}

// other returns the data node that is not name.
func (c *cluster) other(name string) string {
	for n := range c.ports {
		if n != name {
			return n
		}
	}
	panic(fmt.Sprintf("no node but %s", name))
}
