package arborui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// page is what every template gets: the handler's prefix and whether it
// offers actions, the page's title and section, and its own data.
type page struct {
	P       string
	Title   string
	Section string
	Actions bool
	CSRF    string
	Code    int
	Msg     string
	Data    any
}

func (h *handler) page(title any, data any) page {
	p := page{P: h.opts.Prefix, Actions: h.opts.Actions, Data: data}
	if h.opts.Actions {
		p.CSRF = h.csrf
	}
	switch t := title.(type) {
	case int: // an error page: its status
		p.Code, p.Title = t, http.StatusText(t)
		p.Msg, _ = data.(string)
	case string:
		p.Title = t
	}
	return p
}

func (p page) with(data any) page { p.Data = data; return p }

func (p page) in(section string) page { p.Section = section; return p }

// render writes template name with p as a page, scrubbed (see scrub).
func (h *handler) render(w http.ResponseWriter, r *http.Request, name string, p page) {
	var buf bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&buf, name, p); err != nil {
		h.errPage(w, r, fmt.Errorf("render %s: %w", name, err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(scrub(buf.Bytes()))
}

// link is the address prefix+path with the query kv (name, value pairs;
// a pair whose value is empty or zero is left out), every value
// percent-encoded: every address that carries data is built here (or by
// the functions below), never by a template's text.
func link(prefix, path string, kv ...any) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		name := fmt.Sprint(kv[i])
		switch v := kv[i+1].(type) {
		case string:
			if v != "" {
				q.Add(name, v)
			}
		case int64:
			if v != 0 {
				q.Add(name, strconv.FormatInt(v, 10))
			}
		case int:
			if v != 0 {
				q.Add(name, strconv.Itoa(v))
			}
		case bool:
			if v {
				q.Add(name, "1")
			}
		case fmt.Stringer:
			if s := v.String(); s != "" {
				q.Add(name, s)
			}
		default:
			if s := fmt.Sprint(v); s != "" {
				q.Add(name, s)
			}
		}
	}
	if len(q) == 0 {
		return prefix + path
	}
	return prefix + path + "?" + q.Encode()
}

var funcs = template.FuncMap{
	// json shows a JSON document indented; one that does not parse (a
	// payload cut short) as it is.
	"json": func(raw json.RawMessage) string {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return string(raw)
		}
		return buf.String()
	},
	"time": func(v any) string {
		switch t := v.(type) {
		case time.Time:
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		case *time.Time:
			if t == nil {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		return fmt.Sprint(v)
	},
	// clock is a time of day, for a log's rows (the full time is its
	// title).
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
	// since says how long before now t was (or, negative, how long after).
	"since": func(t any, now time.Time) string {
		var at time.Time
		switch v := t.(type) {
		case time.Time:
			at = v
		case *time.Time:
			if v == nil {
				return ""
			}
			at = *v
		default:
			return ""
		}
		d := now.Sub(at)
		if d < 0 {
			return "in " + round(-d)
		}
		return round(d) + " ago"
	},
	"live": func(s arbortype.Status) bool { return s.Live() },
	"dur":  round,
	// budgetPark says a task is parked on a budget: an await of
	// arbortype.BudgetEvent, which only a raise of the budget ends.
	"budgetPark": budgetPark,
	"rerunnable": rerunnable,
	"link":       link,
	"bytes":      humanBytes,
	"plural":     func(n int, one, many string) string { return map[bool]string{true: one, false: many}[n == 1] },
	"add":        func(a, b int) int { return a + b },
	// convURL is the address of a conversation's page, convLive of its
	// tree's stream and convAction of an action on it, the id
	// percent-encoded: an id may hold #, &, + or ?.
	"convURL":    func(prefix, id string) string { return link(prefix, "/conversation", "id", id) },
	"convAction": func(prefix, action, id string) string { return link(prefix, "/conversation/"+action, "id", id) },
	// nodeOf pairs a tree's node with its view, for the recursive "node"
	// template (a template takes one argument).
	"nodeOf":  func(v treeView, n *node) nodeArg { return nodeArg{V: v, N: n} },
	"add64":   func(a, b int64) int64 { return a + b },
	"sub":     func(a, b int) int { return a - b },
	"seconds": func(d time.Duration) int64 { return int64(d / time.Second) },
	// window names a tenant budget's window.
	"window": func(d time.Duration) string {
		switch d {
		case time.Minute:
			return "minute"
		case time.Hour:
			return "hour"
		case 24 * time.Hour:
			return "day"
		}
		return round(d)
	},
	// raiseOf is the "raise" template's argument: a budget's raise.
	"raiseOf": raiseOf,
	// answerOf is the "answer" template's argument: an await's form.
	"answerOf": func(csrf, back, prefix string, t inspect.TaskSummary) answerArg {
		return answerArg{CSRF: csrf, Back: back, P: prefix, T: t}
	},
}

type answerArg struct {
	CSRF, Back, P string
	T             inspect.TaskSummary
}

func round(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}

func humanBytes(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// traceIDField is what Options.TraceURL holds in place of a trace id.
const traceIDField = "{trace_id}"

var traceparent = regexp.MustCompile(`^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}`)

// traceID is the trace id of a task's trace context (its W3C
// traceparent), or "" when it has none that parses: the context is
// whatever the creating code's injector stored, so it is read strictly,
// and only 32 hex digits reach the link.
func traceID(trace map[string]string) string {
	m := traceparent.FindStringSubmatch(strings.ToLower(trace["traceparent"]))
	if m == nil || strings.Trim(m[1], "0") == "" {
		return ""
	}
	return m[1]
}

// traceLink is the link of a trace id to the tracing UI, or "" with none
// configured.
func (h *handler) traceLink(id string) string {
	if h.opts.TraceURL == "" || id == "" {
		return ""
	}
	return strings.ReplaceAll(h.opts.TraceURL, traceIDField, id)
}

// budgetPark says t is parked on a budget (docs/design.md §3.11): an
// await of arbortype.BudgetEvent, which no answer ends, only a raise of
// the budget (tasks.Engine.SetBudget).
func budgetPark(t any) bool {
	var task arbortype.Task
	switch v := t.(type) {
	case arbortype.Task:
		task = v
	case inspect.TaskSummary:
		task = v.Task
	case *arbortype.Task:
		task = *v
	default:
		return false
	}
	return task.Status == arbortype.StatusSleeping && task.AwaitName == arbortype.BudgetEvent
}

// rerunnable says whether t may be rerun from its checkpoint
// (tasks.Engine.Rerun): it failed, was aborted or was cancelled. The
// engine refuses the rest of what it refuses (rerun already, an owner
// settled) with its reason.
func rerunnable(t arbortype.Task) bool {
	switch t.Status {
	case arbortype.StatusFailed, arbortype.StatusAborted, arbortype.StatusCancelled:
		return true
	}
	return false
}
