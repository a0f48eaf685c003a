// Package linediff writes and applies line-based differences between two
// texts in the unified format (hunks of `@@ -a,b +c,d @@`, lines marked ' ',
// '-' or '+'), the format `diff -u` and `patch` read, without their file
// headers.
//
// arbor keeps the history of its generated guard this way
// (internal/guardhistory): the newest guard whole, each older one as the
// difference that turns its successor back into it. Apply is strict: a
// context or removed line that does not match the text exactly is an
// error, never a fuzzy match, so a patch reproduces one text or none.
package linediff

import (
	"fmt"
	"strconv"
	"strings"
)

// context is the number of unchanged lines a hunk shows on each side of a
// change.
const context = 3

// Lines splits a text into its lines, each with its "\n". The text must be
// empty or end with "\n".
func Lines(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if !strings.HasSuffix(s, "\n") {
		return nil, fmt.Errorf("linediff: the text does not end with a newline")
	}
	l := strings.SplitAfter(s, "\n")
	return l[:len(l)-1], nil // SplitAfter's last element is the "" after the final "\n"
}

type op struct {
	kind byte // ' ', '-' or '+'
	line string
}

// Diff returns the hunks that turn a into b: "" when they are the same.
// Both must be empty or end with "\n".
func Diff(a, b string) (string, error) {
	al, err := Lines(a)
	if err != nil {
		return "", err
	}
	bl, err := Lines(b)
	if err != nil {
		return "", err
	}
	ops := script(al, bl)
	var out strings.Builder
	// i and j count the lines of a and b before ops[k].
	i, j := 0, 0
	for k := 0; k < len(ops); {
		if ops[k].kind == ' ' {
			i, j, k = i+1, j+1, k+1
			continue
		}
		// A hunk: up to context lines before the change, then changes and
		// the unchanged runs between them shorter than 2*context+1, then up
		// to context lines after.
		start := max(k-context, 0)
		for s := k; s > start; s-- {
			i, j = i-1, j-1
		}
		end := k
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*context {
				end = min(end+context, len(ops))
				break
			}
			end = run
		}
		var body strings.Builder
		na, nb := 0, 0
		for _, o := range ops[start:end] {
			body.WriteByte(o.kind)
			body.WriteString(o.line)
			if o.kind != '+' {
				na++
			}
			if o.kind != '-' {
				nb++
			}
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", span(i, na), span(j, nb))
		out.WriteString(body.String())
		i, j, k = i+na, j+nb, end
	}
	return out.String(), nil
}

// span renders a hunk's range: its first line (1-based; for an empty range,
// the line before it) and its length.
func span(before, n int) string {
	if n == 0 {
		return strconv.Itoa(before) + ",0"
	}
	return strconv.Itoa(before+1) + "," + strconv.Itoa(n)
}

// script returns a shortest edit script from a to b (a longest common
// subsequence kept), deletions before insertions at each change.
func script(a, b []string) []op {
	n, m := len(a), len(b)
	// lcs[i*(m+1)+j] is the longest common subsequence of a[i:] and b[j:].
	lcs := make([]int32, (n+1)*(m+1))
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			switch {
			case a[i] == b[j]:
				lcs[i*(m+1)+j] = lcs[(i+1)*(m+1)+j+1] + 1
			default:
				lcs[i*(m+1)+j] = max(lcs[(i+1)*(m+1)+j], lcs[i*(m+1)+j+1])
			}
		}
	}
	var ops []op
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			ops = append(ops, op{' ', a[i]})
			i, j = i+1, j+1
		case j == m || (i < n && lcs[(i+1)*(m+1)+j] >= lcs[i*(m+1)+j+1]):
			ops = append(ops, op{'-', a[i]})
			i++
		default:
			ops = append(ops, op{'+', b[j]})
			j++
		}
	}
	return ops
}

// Apply returns the text the hunks of patch turn a into. Every context and
// removed line must match a exactly, and each hunk's counts its header;
// anything else is an error. Lines before the first hunk that start with
// "#" are comments.
func Apply(a, patch string) (string, error) {
	al, err := Lines(a)
	if err != nil {
		return "", err
	}
	pl, err := Lines(patch)
	if err != nil {
		return "", fmt.Errorf("linediff: the patch: %w", err)
	}
	var out strings.Builder
	pos := 0 // lines of a consumed
	k := 0
	for k < len(pl) && strings.HasPrefix(pl[k], "#") {
		k++
	}
	for k < len(pl) {
		var oldStart, oldLen, newStart, newLen int
		if _, err := fmt.Sscanf(pl[k], "@@ -%d,%d +%d,%d @@\n", &oldStart, &oldLen, &newStart, &newLen); err != nil {
			return "", fmt.Errorf("linediff: patch line %d: not a hunk header: %q", k+1, pl[k])
		}
		at := oldStart - 1
		if oldLen == 0 {
			at = oldStart
		}
		// The text written so far must be where the hunk says it lands.
		if written := strings.Count(out.String(), "\n") + (at - pos); (newLen == 0 && newStart != written) || (newLen > 0 && newStart != written+1) {
			return "", fmt.Errorf("linediff: patch line %d: the hunk lands at line %d of the new text, its header says %d", k+1, written+1, newStart)
		}
		if at < pos || at > len(al) {
			return "", fmt.Errorf("linediff: patch line %d: the hunk starts at line %d, outside the text or before the previous hunk's end", k+1, oldStart)
		}
		for _, l := range al[pos:at] {
			out.WriteString(l)
		}
		pos = at
		k++
		na, nb := 0, 0
		for k < len(pl) && !strings.HasPrefix(pl[k], "@@ ") {
			line := pl[k]
			kind, body := line[0], line[1:]
			if line == "\n" { // an empty context line whose space an editor dropped
				kind, body = ' ', "\n"
			}
			switch kind {
			case ' ', '-':
				if pos >= len(al) || al[pos] != body {
					return "", fmt.Errorf("linediff: patch line %d does not match line %d of the text", k+1, pos+1)
				}
				pos++
				na++
				if kind == ' ' {
					out.WriteString(body)
					nb++
				}
			case '+':
				out.WriteString(body)
				nb++
			default:
				return "", fmt.Errorf("linediff: patch line %d: %q is not a context, removed or added line", k+1, line)
			}
			k++
		}
		if na != oldLen || nb != newLen {
			return "", fmt.Errorf("linediff: a hunk at line %d of the text has %d and %d lines, its header says %d and %d", oldStart, na, nb, oldLen, newLen)
		}
	}
	for _, l := range al[pos:] {
		out.WriteString(l)
	}
	return out.String(), nil
}
