package faultharness

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
)

// giveUpRe matches the runner's log lines that say a node stopped its
// handlers for a lease it could not confirm, or lost a conversation's
// lease. The runner's texts (machine/lapse.go, machine/holder.go) are
// "arbor: the node could not confirm its lease in time; …" (with a
// "conversations" count: the fence fired) and "arbor: the node's lease had
// expired in the database; …" (a new life); those of the runner before
// issue 19 ("conversation leases not renewed in time", "conversation lease
// lost") and any message about a lease that says lost, not renewed, not
// confirmed or given up match too — the figures name each message they
// counted, so a renamed one shows.
var giveUpRe = regexp.MustCompile(`(?i)lease.*(lost|not renewed|not confirmed|unconfirmed|could not (be )?(renew|confirm)|gave up|given up|giving up)|could not confirm its lease|lease had expired`)

// logLine is what the figures read of a runner's JSON log line.
type logLine struct {
	Level         string `json:"level"`
	Msg           string `json:"msg"`
	Conversations *int   `json:"conversations"`
}

// logSummary reads the runners' logs (AddRunnerLog): the lines at WARN
// and above by message, and the give-ups (giveUpRe) with the
// conversations they name (the "conversations" attribute, one when there
// is none).
func (s *Scenario) logSummary() (warns map[string]int, giveUps map[string]int, giveUpConvs int) {
	warns, giveUps = map[string]int{}, map[string]int{}
	for _, l := range s.logs {
		b, err := os.ReadFile(l.path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			var l logLine
			if json.Unmarshal([]byte(line), &l) != nil {
				continue
			}
			if giveUpRe.MatchString(l.Msg) {
				giveUps[l.Msg]++
				if l.Conversations != nil {
					giveUpConvs += *l.Conversations
				} else {
					giveUpConvs++
				}
			}
			if l.Level == "WARN" || l.Level == "ERROR" {
				warns[l.Msg]++
			}
		}
	}
	return warns, giveUps, giveUpConvs
}
