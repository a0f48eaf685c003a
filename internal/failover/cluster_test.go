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
	c.t.Fatalf("cluster: timed out waiting for %s; monitor: %v (%v)", what, last, lastErr)
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
	return primary
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
