package store

import (
	"regexp"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// TestEveryNamedQueryIsDefined: every statement of store.SQL is one the
// store runs (define fails at start-up on a name store.SQL lacks, so the
// converse holds whenever this package loads). No dead SQL.
func TestEveryNamedQueryIsDefined(t *testing.T) {
	t.Parallel()
	defined := map[string]bool{}
	for _, name := range queryNames {
		require.False(t, defined[name], "%s is defined twice", name)
		defined[name] = true
	}
	for name, q := range named {
		require.True(t, defined[name], "%s (store/queries/%s) is run by no function of internal/store: remove it", name, q.file)
	}
	require.Len(t, queryNames, len(named))
}

// TestParseQueries checks the reader of store.SQL's files on what it must
// refuse, and that it sends a statement as written, without its comments.
func TestParseQueries(t *testing.T) {
	t.Parallel()
	file := func(text string) fstest.MapFS {
		return fstest.MapFS{"queries/a.sql": {Data: []byte(text)}}
	}
	m, err := parseQueries(file("-- Reads one.\n-- name: One\nSELECT 1\nFROM x;\n\n-- name: Two\nSELECT 2;\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]namedQuery{"One": {"a.sql", "SELECT 1\nFROM x"}, "Two": {"a.sql", "SELECT 2"}}, m)
	for text, want := range map[string]string{
		"-- name: One\nSELECT 1;\n-- name: One\nSELECT 2;\n": "used twice",
		"-- name: One\nSELECT 1\n":                           "no closing semicolon",
		"SELECT 1;\n":                                        "outside a named statement",
		"-- name: \nSELECT 1;\n":                             "empty",
	} {
		_, err := parseQueries(file(text))
		require.ErrorContains(t, err, want, text)
	}
}

// TestSpelledConstantsAreGo: the few values of Go's that store.SQL spells
// as literals (the River job kinds arbor inserts, the steered code) are
// the constants' values, so that renaming one in Go fails here rather than
// leaving a statement that matches nothing.
func TestSpelledConstantsAreGo(t *testing.T) {
	t.Parallel()
	kinds := regexp.MustCompile(`kind = '(arbor_[a-z_]+)'`)
	seen := map[string]int{}
	for i, sql := range queries {
		for _, m := range kinds.FindAllStringSubmatch(sql, -1) {
			require.Contains(t, []string{WakeJobKind, PruneJobKind}, m[1], queryNames[i])
			seen[m[1]]++
		}
	}
	require.NotZero(t, seen[WakeJobKind])
	require.NotZero(t, seen[PruneJobKind])
	require.Contains(t, named["PruneVictims"].sql, "IS DISTINCT FROM '"+arbortype.CodeSteered+"'")
}
