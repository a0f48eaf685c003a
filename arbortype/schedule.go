package arbortype

import (
	"encoding/json"
	"time"
)

// MissedPolicy says what a schedule does with ticks that no runner fired
// in time (every runner down, say): see ScheduleParams.Missed.
type MissedPolicy string

const (
	// MissedSkip drops the ticks missed: the schedule runs next at its
	// next tick to come. The zero value means MissedSkip.
	MissedSkip MissedPolicy = "skip"
	// MissedRunOnce runs one turn, at once, for all the ticks missed, then
	// runs at the next tick to come.
	MissedRunOnce MissedPolicy = "run_once"
)

// ScheduleParams describe a schedule: a turn (a root task) started at cron
// times or every interval, exactly once per tick across every node
// (tasks.Engine.CreateSchedule; docs/agents.md, "Schedules").
type ScheduleParams struct {
	// Name identifies the schedule. Required, at most 150 bytes of text.
	Name string
	// Tenant is the tenant of the turns the schedule creates (see
	// CreateParams.Tenant); "" is the default tenant.
	Tenant string
	// Kind is the kind of the turns it creates. Required, at most 200 bytes.
	Kind string
	// Input is each turn's JSON input; empty for none.
	Input json.RawMessage
	// ConversationID, when set, is the conversation every turn goes to (a
	// turn queues behind a live one). Empty starts each tick's turn in a
	// new conversation, "<Name>@<tick>" (the tick in UTC, RFC 3339:
	// "nightly@2026-12-07T02:00:00Z").
	ConversationID string
	// Cron is a five-field cron expression ("minute hour day-of-month
	// month day-of-week", as in Vixie cron, or a macro such as @daily),
	// read in TimeZone. Exactly one of Cron and Every is set.
	Cron string
	// TimeZone is the IANA time zone Cron is read in ("Europe/Paris");
	// empty means UTC. Only with Cron.
	TimeZone string
	// Every, when Cron is empty, starts a turn every Every (at least a
	// second), the first one Every after the schedule is created.
	Every time.Duration
	// Missed is what the schedule does with ticks no runner fired in time:
	// MissedSkip (the default) or MissedRunOnce.
	Missed MissedPolicy
}

// Schedule is a schedule as stored, with what its last firing did.
type Schedule struct {
	ScheduleParams
	// Paused is true between a PauseSchedule and a ResumeSchedule: no tick
	// fires, and the ticks that pass are not missed ones.
	Paused bool
	// NextAt is the next tick.
	NextAt time.Time
	// LastTickAt is the tick the last turn was started for (zero if none
	// yet), and LastTaskID that turn (0 if none yet, or if the last tick's
	// create failed: LastError says why).
	LastTickAt time.Time
	LastTaskID int64
	LastError  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}
