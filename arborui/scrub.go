package arborui

import (
	"fmt"
	"unicode/utf8"
)

// scrub replaces, in rendered HTML, the characters that act rather than
// show: the C0 controls but tab and line feed (ESC starts a terminal's
// escape sequence, and a page is also read with curl and in logs), DEL,
// the C1 controls (U+009B is a terminal's CSI too) and the bidirectional
// overrides and isolates (U+202A–U+202E, U+2066–U+2069: "Trojan Source"
// text that shows in another order than it reads). A C0 control becomes
// its Control Pictures symbol (ESC: ␛), DEL ␡, the others [U+XXXX]: an
// operator sees that a kind, an id or an error holds one, and which. It
// runs on every page and every pushed fragment after html/template
// escaped them, so no field can be forgotten; the templates themselves
// hold none of these characters, so only data is changed. Values that
// must reach the server unchanged (a conversation id in an action) travel
// in addresses, percent-encoded, never raw.
func scrub(b []byte) []byte {
	i := 0
	for i < len(b) {
		if b[i] < 0x80 {
			if b[i] < 0x20 && b[i] != '\t' && b[i] != '\n' || b[i] == 0x7f {
				break
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if isActingRune(r) || r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+64)
	out = append(out, b[:i]...)
	for i < len(b) {
		c := b[i]
		switch {
		case c < 0x20 && c != '\t' && c != '\n':
			out = utf8.AppendRune(out, 0x2400+rune(c))
			i++
		case c == 0x7f:
			out = utf8.AppendRune(out, 0x2421)
			i++
		case c >= 0x80:
			r, n := utf8.DecodeRune(b[i:])
			if isActingRune(r) || r == utf8.RuneError && n == 1 {
				out = fmt.Appendf(out, "[U+%04X]", r)
			} else {
				out = append(out, b[i:i+n]...)
			}
			i += n
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

func isActingRune(r rune) bool {
	return r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}
