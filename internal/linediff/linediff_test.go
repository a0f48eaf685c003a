package linediff_test

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/linediff"
)

// randomText returns n lines drawn from a small alphabet, so that texts
// share many lines and the differences interleave.
func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString([]string{"a", "b", "c", "", "  d", "e;"}[r.IntN(6)])
		b.WriteString("\n")
	}
	return b.String()
}

// TestDiffThenApplyGivesTheOtherText round-trips random pairs, edits of one
// another and unrelated ones, the empty text among them.
func TestDiffThenApplyGivesTheOtherText(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		a := randomText(r, r.IntN(40))
		b := a
		if round%3 == 0 {
			b = randomText(r, r.IntN(40))
		} else {
			lines, err := linediff.Lines(a)
			require.NoError(t, err)
			for range r.IntN(5) {
				at := r.IntN(len(lines) + 1)
				switch r.IntN(2) {
				case 0:
					lines = append(lines[:at], append([]string{"new\n"}, lines[at:]...)...)
				default:
					if at < len(lines) {
						lines = append(lines[:at], lines[at+1:]...)
					}
				}
			}
			b = strings.Join(lines, "")
		}
		patch, err := linediff.Diff(a, b)
		require.NoError(t, err)
		if a == b {
			require.Empty(t, patch)
		}
		got, err := linediff.Apply(a, patch)
		require.NoError(t, err, "round %d: patch\n%s", round, patch)
		require.Equal(t, b, got, "round %d: patch\n%s", round, patch)
	}
}

// TestPatchReadsAsPatchReadsIt checks the format against patch(1), when the
// machine has it: the same hunks give the same text.
func TestPatchReadsAsPatchReadsIt(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("patch"); err != nil {
		t.Skip("patch(1) is not on this machine: the format is checked by the round trip alone")
	}
	r := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	for range 50 {
		a, b := randomText(r, 30), randomText(r, 30)
		patch, err := linediff.Diff(a, b)
		require.NoError(t, err)
		file := filepath.Join(dir, "text")
		require.NoError(t, os.WriteFile(file, []byte(a), 0o644))
		cmd := exec.Command("patch", "--quiet", "--fuzz=0", "--no-backup-if-mismatch", file)
		cmd.Stdin = strings.NewReader("--- text\n+++ text\n" + patch)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		got, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Equal(t, b, string(got))
	}
}

// TestApplyRefusesWhatDoesNotMatch: a patch made for another text, a
// broken count or a line without its mark is an error, never a guess.
func TestApplyRefusesWhatDoesNotMatch(t *testing.T) {
	t.Parallel()
	a := "one\ntwo\nthree\nfour\n"
	patch, err := linediff.Diff(a, "one\n2\nthree\nfour\n")
	require.NoError(t, err)
	for name, c := range map[string]struct{ text, patch string }{
		"another text":      {"one\nTWO\nthree\nfour\n", patch},
		"a context changed": {"ONE\ntwo\nthree\nfour\n", patch},
		"a wrong count":     {a, strings.Replace(patch, "+1,4", "+1,5", 1)},
		"a wrong new start": {a, strings.Replace(patch, "+1,4", "+2,4", 1)},
		"an unmarked line":  {a, patch + "x\n"},
		"no newline at end": {"one\ntwo", patch},
		"not a hunk":        {a, "@@ nonsense\n"},
	} {
		_, err := linediff.Apply(c.text, c.patch)
		require.Error(t, err, name)
	}
}
