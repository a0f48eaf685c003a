package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/arborhq/arbor/arbortype"
)

const scheduleHelp = `Usage: arbor schedule add NAME --kind K (--cron EXPR | --every DUR) [flags]
       arbor schedule ls
       arbor schedule pause NAME | resume NAME | rm NAME

A schedule starts a turn of kind K at cron times or every interval, once
per tick across every node (the runners' maintenance fires it, within
their PollInterval). The turn goes to --conversation, or to a new
conversation per tick ("NAME@TICK"). --cron is a five-field expression
(minute hour day-of-month month day-of-week) read in --tz (default UTC);
--every an interval of at least 1s. --missed says what happens to ticks
no runner fired in time: skip (the default) drops them; run_once runs one
turn for them all. add replaces a schedule of the same name (its pause
stays). A paused schedule fires nothing; resumed, it starts again at its
next tick to come.

Example:
  arbor schedule add nightly --kind digest --cron "0 2 * * *" --tz Europe/Paris --missed run_once
  arbor schedule add poll --kind poll_inbox --every 10m --conversation inbox --input '{"box":"support"}'
  arbor schedule ls
  arbor schedule pause nightly
  arbor schedule rm poll
`

func cmdSchedule(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("schedule", scheduleHelp, stderr)
	var db dbFlags
	db.register(fs)
	kind := fs.String("kind", "", "add: the kind of the turns it starts (required)")
	cronExpr := fs.String("cron", "", "add: a five-field cron expression (minute hour day-of-month month day-of-week)")
	every := fs.Duration("every", 0, "add: an interval (at least 1s) instead of --cron")
	input := fs.String("input", "", "add: the turns' JSON input")
	conv := fs.String("conversation", "", "add: the conversation of every turn (default: a new one per tick)")
	tenant := fs.String("tenant", "", "add: the tenant of the turns (default: the default tenant)")
	missed := fs.String("missed", "", "add: skip or run_once: what to do with ticks no runner fired in time (default skip)")
	tz := fs.String("tz", "", "add: the time zone --cron is read in (default UTC)")
	pos, err := parseArgs(fs, args, 1, 2, "a subcommand (add, ls, pause, resume, rm)")
	if err != nil {
		return err
	}
	sub := pos[0]
	switch sub {
	case "ls":
		if len(pos) != 1 {
			return fmt.Errorf("schedule ls: unexpected argument %q", pos[1])
		}
	case "add", "pause", "resume", "rm":
		if len(pos) != 2 {
			return fmt.Errorf("schedule %s: missing the schedule's name (see arbor schedule --help)", sub)
		}
	default:
		return fmt.Errorf("schedule: unknown subcommand %q: want add, ls, pause, resume or rm", sub)
	}
	var p arbortype.ScheduleParams
	if sub == "add" {
		if *kind == "" {
			return fmt.Errorf("schedule add: --kind is required")
		}
		if (*cronExpr == "") == (*every == 0) {
			return fmt.Errorf("schedule add: give one of --cron and --every")
		}
		if *input != "" && !json.Valid([]byte(*input)) {
			return fmt.Errorf("schedule add: --input is not valid JSON")
		}
		p = arbortype.ScheduleParams{Name: pos[1], Kind: *kind, Cron: *cronExpr, Every: *every, ConversationID: *conv,
			Tenant: *tenant, Missed: arbortype.MissedPolicy(*missed), TimeZone: *tz}
		if *input != "" {
			p.Input = json.RawMessage(*input)
		}
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	var s arbortype.Schedule
	switch sub {
	case "ls":
		all, err := engine.Schedules(ctx)
		if err != nil {
			return fmt.Errorf("schedule ls: %w", err)
		}
		if len(all) == 0 {
			fmt.Fprintln(stdout, "no schedules")
		}
		for _, s := range all {
			fmt.Fprintln(stdout, scheduleLine(s))
		}
		return nil
	case "add":
		s, err = engine.CreateSchedule(ctx, p)
	case "pause":
		s, err = engine.PauseSchedule(ctx, pos[1])
	case "resume":
		s, err = engine.ResumeSchedule(ctx, pos[1])
	case "rm":
		if err := engine.DeleteSchedule(ctx, pos[1]); err != nil {
			return fmt.Errorf("schedule rm: %w", err)
		}
		fmt.Fprintf(stdout, "schedule %s removed\n", printable(pos[1]))
		return nil
	}
	if err != nil {
		return fmt.Errorf("schedule %s: %w", sub, err)
	}
	fmt.Fprintln(stdout, scheduleLine(s))
	return nil
}

// scheduleLine is one schedule on one line: its name, timing, what it
// starts, its state and its last firing.
func scheduleLine(s arbortype.Schedule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "schedule %s", printable(s.Name))
	if s.Cron != "" {
		fmt.Fprintf(&b, " cron=%q tz=%s", s.Cron, printable(s.TimeZone))
	} else {
		fmt.Fprintf(&b, " every=%s", s.Every)
	}
	fmt.Fprintf(&b, " kind=%s", printable(s.Kind))
	if s.Tenant != "" {
		fmt.Fprintf(&b, " tenant=%s", printable(s.Tenant))
	}
	if s.ConversationID != "" {
		fmt.Fprintf(&b, " conversation=%s", printable(s.ConversationID))
	} else {
		b.WriteString(" conversation=new-per-tick")
	}
	fmt.Fprintf(&b, " missed=%s", s.Missed)
	if s.Paused {
		b.WriteString(" paused")
	}
	fmt.Fprintf(&b, " next=%s", formatTime(&s.NextAt))
	if !s.LastTickAt.IsZero() {
		fmt.Fprintf(&b, " last=%s", formatTime(&s.LastTickAt))
		if s.LastTaskID != 0 {
			fmt.Fprintf(&b, " task=#%d", s.LastTaskID)
		}
	}
	if s.LastError != "" {
		fmt.Fprintf(&b, " error=%q", s.LastError)
	}
	return b.String()
}
