package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

func TestBackoffDoublesJittersAndCaps(t *testing.T) {
	t.Parallel()
	base, ceiling := 100*time.Millisecond, time.Second
	for retry, nominal := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		nominal *= time.Millisecond
		require.Equal(t, nominal/2, backoff(retry, base, ceiling, 0), "retry %d, no jitter: half the nominal delay", retry)
		require.Equal(t, nominal, backoff(retry, base, ceiling, 1), "retry %d, full jitter: the nominal delay", retry)
		mid := backoff(retry, base, ceiling, 0.5)
		require.Greater(t, mid, nominal/2)
		require.Less(t, mid, nominal)
	}
	require.Equal(t, ceiling, backoff(1000, base, ceiling, 1), "huge retry counts do not overflow")
	require.Equal(t, time.Duration(0), backoff(3, 0, ceiling, 0.7), "a zero base retries at once")
}

func TestValidateBackoff(t *testing.T) {
	t.Parallel()
	require.NoError(t, ValidateBackoff(0, 0))
	require.NoError(t, ValidateBackoff(time.Second, time.Minute))
	require.ErrorIs(t, ValidateBackoff(time.Minute, time.Second), arbortype.ErrInvalidArgument)
	require.ErrorIs(t, ValidateBackoff(-time.Second, time.Second), arbortype.ErrInvalidArgument)
	require.ErrorIs(t, ValidateBackoff(time.Second, 30*24*time.Hour), arbortype.ErrInvalidArgument)
}
