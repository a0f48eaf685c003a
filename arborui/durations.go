package arborui

import (
	"fmt"
	"slices"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// A task's durations and a turn's timeline, from what the tables hold: a
// task's timestamps (CreatedAt; StartedAt, its first start; SettledAt)
// and the status entries of its conversation's log, each written by the
// statement that changed the status, with its time. The log gives the
// time in each status (queued, running, waiting, sleeping…); where it was
// pruned (tasks.Config.LogRetention) the timestamps give the time queued
// before the first start and from it to the settle.

// durations are a task's, as its page shows them.
type durations struct {
	// Queued is from its creation to its first start (or to now, never
	// started and still pending); NeverStarted says it did not start.
	Queued       time.Duration
	NeverStarted bool
	// Total is from its creation to its settle (or to now, when live).
	Total time.Duration
	// InStatus is the time spent in each status, in the order first
	// entered, from its log's status entries (none when the log has none
	// of the task: pruned); Partial says the entries read do not reach
	// back to its creation.
	InStatus []statusTime
	Partial  bool
}

type statusTime struct {
	Status arbortype.Status
	D      time.Duration
}

// span is a stretch of a task's life in one status.
type span struct {
	Status   arbortype.Status
	From, To time.Time
}

// statusSpans are task t's stretches in each status from its status
// entries (any order; others are skipped), the last one to its settle or
// to now.
func statusSpans(t arbortype.Task, entries []logRow, now time.Time) []span {
	var st []logRow
	for _, e := range entries {
		if e.Kind == arbortype.LogKindStatus && e.TaskID == t.ID {
			st = append(st, e)
		}
	}
	slices.SortFunc(st, func(a, b logRow) int { return int(a.Seq - b.Seq) })
	var out []span
	for i, e := range st {
		if e.Status.Settled() {
			break
		}
		to := now
		switch {
		case i+1 < len(st):
			to = st[i+1].At
		case t.SettledAt != nil:
			to = *t.SettledAt
		}
		if to.Before(e.At) {
			to = e.At
		}
		out = append(out, span{Status: e.Status, From: e.At, To: to})
	}
	return out
}

// durationsOf are task t's durations, from its timestamps and its log's
// entries (rows: of its log, any order); partial says older entries were
// not read.
func durationsOf(t arbortype.Task, rows []logRow, partial bool, now time.Time) durations {
	end := now
	if t.SettledAt != nil {
		end = *t.SettledAt
	}
	d := durations{Total: end.Sub(t.CreatedAt), Partial: partial}
	switch {
	case t.StartedAt != nil:
		d.Queued = t.StartedAt.Sub(t.CreatedAt)
	default:
		d.NeverStarted = true
		d.Queued = end.Sub(t.CreatedAt)
	}
	for _, s := range statusSpans(t, rows, now) {
		i := slices.IndexFunc(d.InStatus, func(x statusTime) bool { return x.Status == s.Status })
		if i < 0 {
			d.InStatus = append(d.InStatus, statusTime{Status: s.Status})
			i = len(d.InStatus) - 1
		}
		d.InStatus[i].D += s.To.Sub(s.From)
	}
	return d
}

// timeline is a turn's (or any task's) timeline: a bar per task, on one
// time scale, drawn in SVG (its geometry in attributes, which the page's
// Content-Security-Policy allows, unlike inline styles).
type timeline struct {
	Rows []timelineRow
	// Span is the time the scale covers, from the first creation.
	Span time.Duration
	// More says the task has children the timeline does not draw.
	More bool
}

type timelineRow struct {
	ID   int64
	Kind string
	// Self is the task whose page it is; its bar is drawn from its log.
	Self bool
	Segs []segment
	// Label says the row's times in words.
	Label string
}

// segment is a stretch of a bar: X and W in thousandths of the scale.
type segment struct {
	X, W  int
	Class string
	Title string
}

// timelineOf draws task t (with its log's entries, rows) and its
// children on the page, kids, as of now.
func timelineOf(t arbortype.Task, rows []logRow, kids []inspect.TaskSummary, more bool, now time.Time) timeline {
	t0 := t.CreatedAt
	end := func(x arbortype.Task) time.Time {
		if x.SettledAt != nil {
			return *x.SettledAt
		}
		return now
	}
	t1 := end(t)
	for _, k := range kids {
		if k.CreatedAt.Before(t0) {
			t0 = k.CreatedAt
		}
		if e := end(k.Task); e.After(t1) {
			t1 = e
		}
	}
	total := t1.Sub(t0)
	if total <= 0 {
		total = time.Millisecond
	}
	at := func(x time.Time) int { return int(int64(x.Sub(t0)) * 1000 / int64(total)) }
	seg := func(from, to time.Time, class, what string) segment {
		x, w := at(from), at(to)-at(from)
		if w < 2 {
			w = 2 // a stretch too short to see still shows
		}
		if x+w > 1000 {
			x = max(0, 1000-w)
		}
		return segment{X: x, W: w, Class: class, Title: what + " " + round(to.Sub(from))}
	}
	// bar draws a task from its timestamps: queued, then its status from
	// its first start to its settle (or now).
	bar := func(x arbortype.Task) []segment {
		if x.StartedAt == nil {
			return []segment{seg(x.CreatedAt, end(x), "seg-queued", "queued")}
		}
		return []segment{seg(x.CreatedAt, *x.StartedAt, "seg-queued", "queued"),
			seg(*x.StartedAt, end(x), "seg-"+string(x.Status), string(x.Status)+" (since its first start)")}
	}
	self := timelineRow{ID: t.ID, Kind: t.Kind, Self: true, Label: rowLabel(t, now)}
	if spans := statusSpans(t, rows, now); len(spans) > 0 {
		for _, s := range spans {
			class := "seg-" + string(s.Status)
			if s.Status == arbortype.StatusPending {
				class = "seg-queued"
			}
			self.Segs = append(self.Segs, seg(s.From, s.To, class, string(s.Status)))
		}
	} else {
		self.Segs = bar(t)
	}
	out := timeline{Rows: []timelineRow{self}, Span: total, More: more}
	for _, k := range kids {
		out.Rows = append(out.Rows, timelineRow{ID: k.ID, Kind: k.Kind, Segs: bar(k.Task), Label: rowLabel(k.Task, now)})
	}
	return out
}

// rowLabel says a task's times in words: queued for, then ran (or runs)
// for.
func rowLabel(t arbortype.Task, now time.Time) string {
	if t.StartedAt == nil {
		if t.SettledAt != nil {
			return fmt.Sprintf("%s without starting, after %s", t.Status, round(t.SettledAt.Sub(t.CreatedAt)))
		}
		return "queued " + round(now.Sub(t.CreatedAt))
	}
	q := "queued " + round(t.StartedAt.Sub(t.CreatedAt))
	if t.SettledAt != nil {
		return fmt.Sprintf("%s, then %s after %s", q, t.Status, round(t.SettledAt.Sub(*t.StartedAt)))
	}
	return fmt.Sprintf("%s, %s for %s since its first start", q, t.Status, round(now.Sub(*t.StartedAt)))
}
