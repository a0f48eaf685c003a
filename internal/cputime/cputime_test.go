package cputime

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// procStat reads this process's own line of /proc: its parent, and CPU
// times that only grow.
func TestProcStatOfSelf(t *testing.T) {
	t.Parallel()
	st, ok := procStat(os.Getpid())
	require.True(t, ok)
	require.Equal(t, os.Getppid(), st.ppid)
	require.NotEmpty(t, st.comm)
	before := Client()
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	require.NotZero(t, x)
	require.Greater(t, Client(), before, "the CPU time the loop used is counted")
	_, ok = procStat(-1)
	require.False(t, ok, "no process has pid -1")
}
