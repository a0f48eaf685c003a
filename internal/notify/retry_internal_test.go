package notify

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestListenRetryResetsAfterSuccess: a LISTEN connection that subscribed
// and was then lost is tried again soon, however many failures came before;
// only attempts that never subscribe back off.
func TestListenRetryResetsAfterSuccess(t *testing.T) {
	t.Parallel()
	retry := time.Duration(0)
	var waits []time.Duration
	for range 12 {
		retry = nextRetry(retry, false)
		waits = append(waits, retry)
	}
	require.Equal(t, 10*time.Millisecond, waits[0])
	require.Equal(t, 20*time.Millisecond, waits[1])
	require.Equal(t, 5*time.Second, waits[len(waits)-1], "capped")
	require.Equal(t, 10*time.Millisecond, nextRetry(retry, true), "a connection that listened resets the backoff")
}
