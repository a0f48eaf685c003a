package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestUI: arbor ui serves the view until interrupted, read-only unless
// --actions is given, and exits 0 on SIGINT.
func TestUI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	for _, c := range []struct {
		flags   []string
		refused bool
	}{{nil, true}, {[]string{"--actions"}, false}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		args := append([]string{"ui", "--addr", "127.0.0.1:0", "--database-url", testdb.URL(t), "--schema", b.schema}, c.flags...)
		cmd := exec.CommandContext(ctx, arborBin, args...)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		addr := regexp.MustCompile(`http://[0-9.:]+/`).FindString(line)
		require.NotEmpty(t, addr, line)

		res, err := http.Get(addr + "conversation?id=" + b.conv)
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, string(body), "chat_turn")
		res, err = http.Post(addr+"tasks/1/abort", "application/x-www-form-urlencoded", nil)
		require.NoError(t, err)
		res.Body.Close()
		// Read-only refuses the POST as such; with actions the missing
		// token refuses it: 403 both, nothing written.
		require.Equal(t, http.StatusForbidden, res.StatusCode)

		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		require.NoError(t, cmd.Wait(), "exit 0 on SIGINT")
	}
	b.arbor(t, "tree", b.conv, "--no-age").ok(t)
}

func TestUIRefusesBadFlags(t *testing.T) {
	t.Parallel()
	runArbor(t, nil, "ui", "extra").fails(t, 1, `unexpected argument "extra"`)
	runArbor(t, nil, "ui").fails(t, 1, "no database")
	b := setup(t)
	b.arbor(t, "ui", "--addr", "nonsense").fails(t, 1, "ui: listen tcp: address nonsense")
	b.arbor(t, "ui", "--trace-url", "https://trace.example/").fails(t, 1, "Options.TraceURL")
	b.arbor(t, "ui", "--allowed-host", "a/b").fails(t, 1, "Options.AllowedHosts")
	// A malformed host is an error, not an entry that never matches (on a
	// port of its own: were it accepted, the view would serve until the
	// run's timeout, and the test fail).
	for _, host := range []string{"host:99999", "host:-1", "[::1", strings.Repeat("a", 300), "a..b", "ok.test, host:"} {
		t.Run(fmt.Sprintf("%.20s", host), func(t *testing.T) {
			t.Parallel()
			b.arbor(t, "ui", "--addr", "127.0.0.1:0", "--allowed-host", host).fails(t, 1, "Options.AllowedHosts")
		})
	}
}

// TestUIHosts: arbor ui answers the hosts --allowed-host names (and IP
// addresses, localhost), and refuses others: a page of evil.example
// resolved to its address (DNS rebinding) reads nothing.
func TestUIHosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, arborBin, "ui", "--addr", "127.0.0.1:0", "--database-url", testdb.URL(t), "--schema", b.schema,
		"--allowed-host", "arbor.test, ops.test")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	addr := regexp.MustCompile(`http://[0-9.:]+/`).FindString(line)
	require.NotEmpty(t, addr, line)
	for host, want := range map[string]int{"arbor.test": 200, "ops.test:8080": 200, "localhost": 200, "evil.example": 403} {
		req, err := http.NewRequest(http.MethodGet, addr, nil)
		require.NoError(t, err)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, want, res.StatusCode, host)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT")
}
