// Package sqllit writes arbor's statuses as SQL literals, for the rules of
// package fsm and the triggers internal/fsmgen generates from them.
package sqllit

import (
	"strings"

	"github.com/arborhq/arbor/arbortype"
)

// Settled returns the settled statuses, in arbortype.Statuses' order.
func Settled() []string {
	var out []string
	for _, s := range arbortype.Statuses {
		if s.Settled() {
			out = append(out, string(s))
		}
	}
	return out
}

// Live returns the live statuses, in arbortype.LiveStatuses' order.
func Live() []string {
	out := make([]string, len(arbortype.LiveStatuses))
	for i, s := range arbortype.LiveStatuses {
		out[i] = string(s)
	}
	return out
}

// Quoted renders ss as a list of SQL string literals: 'a', 'b'. The
// statuses hold no quote.
func Quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "'" + s + "'"
	}
	return strings.Join(q, ", ")
}
