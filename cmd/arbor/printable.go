package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The text commands print data that whoever created a task chose (a kind,
// a phase, an error message, a payload, a conversation id, a holder's
// name) to a terminal, which obeys the control characters in it: ESC
// starts sequences that move the cursor, clear the screen, retitle the
// window or hide text; a C1 control such as U+009B does the same on some
// terminals; U+202E reverses the text after it; a newline or a carriage
// return forges lines. Every string from the database or the command line
// that a command prints as text goes through printable first, including
// the statuses that the schema's CHECKs constrain: what reaches a terminal
// does not depend on them. --json output is left to encoding/json.

// printable returns s with every rune that is neither visible nor a space
// written as Go writes it in a string literal (\x1b, \n, \u202e, \x9b for a
// byte that is not UTF-8), and everything else as it is: text in any
// script, emoji, spaces and backslashes stay readable.
func printable(s string) string { return escapeControls(s, "") }

// printableLines is printable for text of several lines: each line is
// escaped, and the lines are joined with sep (a newline and the indent
// that the text is printed at).
func printableLines(s, sep string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = printable(l)
	}
	return strings.Join(lines, sep)
}

// escapeControls is printable, except that the runes in keep pass as they
// are.
func escapeControls(s, keep string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsGraphic(r) || strings.ContainsRune(keep, r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// printableWriter is the output of every command's flag set. The flag
// package writes its own error message there before the usage, and that
// message echoes the command line (flag provided but not defined: -…),
// which a script may have built from a task's data. The newlines and tabs
// that lay out the flag package's text pass; nothing else unprintable
// does.
type printableWriter struct{ w io.Writer }

func (p printableWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, escapeControls(string(b), "\n\t")); err != nil {
		return 0, err
	}
	return len(b), nil
}
