package main

import (
	"bytes"
	"errors"
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
)

// The flags are refused before anything connects: none of these needs a
// database.
func TestArgsRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"positional":   {[]string{"extra"}, "unexpected arguments"},
		"sizes form":   {[]string{"--database-url", "postgres://nowhere.invalid/x", "--sizes", "a:10"}, "not KEY=SIZE"},
		"unknown size": {[]string{"--database-url", "postgres://nowhere.invalid/x", "--sizes", "z=10"}, `no scenario "z"`},
		"bad size":     {[]string{"--database-url", "postgres://nowhere.invalid/x", "--sizes", "b=10"}, "PxC"},
		"unknown only": {[]string{"--database-url", "postgres://nowhere.invalid/x", "--only", "a,q"}, `no scenario "q"`},
		"rounds":       {[]string{"--database-url", "postgres://nowhere.invalid/x", "--rounds", "-1"}, "Options.Rounds"},
		"reps":         {[]string{"--database-url", "postgres://nowhere.invalid/x", "--reps", "-2"}, "Options.Rounds"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			err := run(tc.args, &out, &errOut)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestHelpListsScenarios(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := run([]string{"--help"}, &out, &errOut)
	require.True(t, errors.Is(err, flag.ErrHelp))
	for _, want := range []string{"flat", "fan-out", "abort", "reconcile_on_open", "wake lateness", "-quick", "-sizes", "-leave", "-run-timeout", "child settles", "budget reservation", "-soak", "-soak-duration", "-goworkflows-dir", "-reps", "-rounds", "median"} {
		require.Contains(t, errOut.String(), want)
	}
}
