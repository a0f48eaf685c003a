// Package awaittoken reads the task an await token names, for the engine
// and the web view alike: one parser of the token's form (docs/design.md
// §3.12), "awt_", the task id in decimal, "_", 32 hex digits.
package awaittoken

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// Task returns the task id token names; false for a token of another form
// (one issued before tokens named their task, or not arbor's).
func Task(token string) (int64, bool) {
	rest, ok := strings.CutPrefix(token, "awt_")
	if !ok {
		return 0, false
	}
	id, random, ok := strings.Cut(rest, "_")
	if !ok || len(random) != 32 {
		return 0, false
	}
	if _, err := hex.DecodeString(random); err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != id {
		return 0, false
	}
	return n, true
}
