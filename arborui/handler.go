package arborui

import (
	"bytes"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
	"github.com/arborhq/arbor/tasks"
)

// Defaults of Options.
const (
	// RecentLimitDefault is how many conversations a page of the front
	// page's list shows.
	RecentLimitDefault = 50
	// TreeLimitDefault is how many tasks a page of a conversation's tree
	// draws.
	TreeLimitDefault = 500
	// ScanLimitDefault is how many rows a page of a list reads, at most,
	// to find what its filters keep.
	ScanLimitDefault = 10_000
	// RefreshDefault is how often a list's stream looks for news.
	RefreshDefault = time.Second
)

// Options configure a handler. The zero value of every field means its
// default; a nil *Options is all defaults.
type Options struct {
	// Prefix is the path the handler is mounted under, such as "/arbor":
	// it starts with a slash and does not end with one. Mount the handler
	// at Prefix+"/" (mux.Handle("/arbor/", h)); it strips the prefix itself
	// and writes it into every link. Default "": the root.
	Prefix string
	// Actions offers and accepts the operator's actions: abort (with a
	// reason), cancel, wake, emit, the answer (approve or deny) of an
	// await, the raise of a budget a turn is parked on, and the bulk abort
	// or cancel of the conversations selected in the list. Default false: the view is read-only, shows no action, refuses
	// every POST with 403 and hides await tokens (a token answers an
	// approval). Turn it on only behind your own authentication: the
	// handler authenticates nobody, it only checks that a POST carries its
	// token and comes from its own origin and host.
	Actions bool
	// AllowedHosts are the host names the handler answers besides IP
	// literals and localhost (with any port), such as "arbor.internal" or,
	// with a port, "ops.example.com:8443" (that port only). A request whose
	// Host header names another host is refused with 403 before anything
	// is read: a page of another site whose name resolves to the handler's
	// address (DNS rebinding) would otherwise read the view and its action
	// token as if it were the view's own. List the names your users reach
	// the handler by; "*" turns the check off (only behind a proxy that
	// checks the host itself). A name is compared without its case and
	// without a fully qualified name's trailing dot, on both sides
	// ("Ops.Example.com." is "ops.example.com"). An entry must be a host
	// name (labels of 1 to 63 ASCII letters, digits, hyphens and
	// underscores, 253 bytes at most; an international name in its xn--
	// form) or an IP address, with an optional port from 1 to 65535
	// ("[::1]:8443" for an IPv6 address with one), or "*": anything else
	// is an error of NewHandler. Default: none (IP literals and localhost
	// only).
	AllowedHosts []string
	// TraceURL links a task's trace id to your tracing UI: an http(s)
	// address in which {trace_id} stands for the 32 hex digits of the
	// trace id the task was created in (its W3C traceparent, see
	// arbortype.Task.Trace), such as
	// "https://grafana.example/explore?traceId={trace_id}". Default "":
	// the id is shown, not linked.
	TraceURL string
	// RecentLimit is how many conversations a page of the front page's
	// list shows (1..1000). Default RecentLimitDefault (50).
	RecentLimit int
	// TreeLimit is how many tasks a page of a conversation's tree draws
	// (1..5000); a larger tree is paged, with what each page leaves out
	// counted. Default TreeLimitDefault (500).
	TreeLimit int
	// ScanLimit is how many rows a page of a list reads, at most, to find
	// the rows its filters keep (100..100,000): a filter that keeps few
	// shows a partial page, with a link that reads on. Default
	// ScanLimitDefault (10,000).
	ScanLimit int
	// Refresh is how often the streams of the lists (conversations,
	// approvals, nodes, limits) look for news: one read of the newest log
	// entry's number, which costs the same however many conversations
	// there are (the nodes and the limits read their own small tables
	// again).
	// A conversation's and a task's streams need none: they follow the
	// conversation's log. Default RefreshDefault (1 s).
	Refresh time.Duration
	// Logger receives the errors the handler answers with 500. Default:
	// discard.
	Logger *slog.Logger
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o *Options) WithDefaults() *Options {
	out := Options{}
	if o != nil {
		out = *o
	}
	if out.RecentLimit == 0 {
		out.RecentLimit = RecentLimitDefault
	}
	if out.TreeLimit == 0 {
		out.TreeLimit = TreeLimitDefault
	}
	if out.ScanLimit == 0 {
		out.ScanLimit = ScanLimitDefault
	}
	if out.Refresh == 0 {
		out.Refresh = RefreshDefault
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

func (o *Options) validate() error {
	if o.Prefix != "" && (!strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/")) {
		return fmt.Errorf("Options.Prefix: %q must start with a slash and not end with one", o.Prefix)
	}
	if strings.ContainsAny(o.Prefix, "?#%\"'<> \\") || strings.ContainsFunc(o.Prefix, func(c rune) bool { return c < ' ' || c == 0x7f }) {
		return fmt.Errorf("Options.Prefix: %q has a character a path prefix cannot have", o.Prefix)
	}
	if o.RecentLimit < 1 || o.RecentLimit > 1000 {
		return fmt.Errorf("Options.RecentLimit: %d is outside 1..1000", o.RecentLimit)
	}
	if o.TreeLimit < 1 || o.TreeLimit > 5000 {
		return fmt.Errorf("Options.TreeLimit: %d is outside 1..5000", o.TreeLimit)
	}
	if o.ScanLimit < 100 || o.ScanLimit > 100_000 {
		return fmt.Errorf("Options.ScanLimit: %d is outside 100..100000", o.ScanLimit)
	}
	if o.Refresh < 10*time.Millisecond || o.Refresh > time.Minute {
		return fmt.Errorf("Options.Refresh: %v is outside 10ms..1m", o.Refresh)
	}
	for _, host := range o.AllowedHosts {
		if _, err := allowedHost(host); err != nil {
			return fmt.Errorf("Options.AllowedHosts: %q is not a host name with an optional port (such as ops.example.com or ops.example.com:8443), "+
				"an IP address, nor \"*\": %w", host, err)
		}
	}
	if o.TraceURL != "" {
		u, err := url.Parse(strings.ReplaceAll(o.TraceURL, traceIDField, "0"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.Contains(o.TraceURL, traceIDField) {
			return fmt.Errorf("Options.TraceURL: %q is not an http(s) address holding %s", o.TraceURL, traceIDField)
		}
	}
	return nil
}

//go:embed assets templates
var files embed.FS

// handler serves the view of one Engine.
type handler struct {
	engine *tasks.Engine
	reader *inspect.Reader
	opts   *Options
	// csrf is the token every action's form carries; a POST without it is
	// refused. It is new with every handler, so a form of another process
	// (or of this one before a restart) is refused too.
	csrf string
	tmpl *template.Template
	mux  *http.ServeMux
	// hosts are Options.AllowedHosts, normalised (allowedHost); anyHost
	// is "*" among them.
	hosts   map[string]bool
	anyHost bool
	// watches share one follower of a conversation's log among the
	// streams of it.
	watches *watches
}

// NewHandler returns the web view of engine, to mount in your own server
// under opts.Prefix (see Options). An invalid option is an error naming the
// field, wrapping arbortype.ErrInvalidArgument.
func NewHandler(engine *tasks.Engine, opts *Options) (http.Handler, error) {
	if engine == nil {
		return nil, fmt.Errorf("arborui.NewHandler: engine is nil: %w", arbortype.ErrInvalidArgument)
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("arborui.NewHandler: %w: %w", arbortype.ErrInvalidArgument, err)
	}
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	tmpl, err := template.New("").Funcs(funcs).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("arborui.NewHandler: templates: %w", err)
	}
	h := &handler{engine: engine, reader: inspect.New(engine), opts: opts, csrf: hex.EncodeToString(b[:]), tmpl: tmpl, mux: http.NewServeMux(),
		hosts: map[string]bool{}, watches: newWatches(engine, opts.Logger)}
	for _, host := range opts.AllowedHosts {
		norm, _ := allowedHost(host) // validated above
		h.hosts[norm] = true
		h.anyHost = h.anyHost || norm == "*"
	}
	h.mux.HandleFunc("GET /assets/{name}", h.asset)
	h.mux.HandleFunc("GET /{$}", h.index)
	h.mux.HandleFunc("GET /live", h.indexLive)
	h.mux.HandleFunc("GET /conversation", h.conversation)
	h.mux.HandleFunc("GET /conversation/live", h.conversationLive)
	h.mux.HandleFunc("GET /conversation/log", h.conversationLog)
	h.mux.HandleFunc("GET /conversation/log/live", h.conversationLogLive)
	h.mux.HandleFunc("GET /tasks/{id}", h.task)
	h.mux.HandleFunc("GET /tasks/{id}/live", h.taskLive)
	h.mux.HandleFunc("GET /tasks/{id}/doc/{field}", h.taskDoc)
	h.mux.HandleFunc("GET /approvals", h.approvals)
	h.mux.HandleFunc("GET /approvals/live", h.approvalsLive)
	h.mux.HandleFunc("GET /nodes", h.nodes)
	h.mux.HandleFunc("GET /nodes/live", h.nodesLive)
	h.mux.HandleFunc("GET /limits", h.limits)
	h.mux.HandleFunc("GET /limits/live", h.limitsLive)
	h.mux.HandleFunc("GET /schedules", h.schedules)
	h.mux.HandleFunc("GET /stats", h.stats)
	h.mux.HandleFunc("GET /stats/live", h.statsLive)
	h.mux.HandleFunc("POST /tasks/{id}/{action}", h.taskAction)
	h.mux.HandleFunc("POST /conversation/{action}", h.conversationAction)
	h.mux.HandleFunc("POST /conversations/bulk", h.bulk)
	return h, nil
}

// ServeHTTP strips the prefix and serves the view, with headers that keep
// its pages out of other sites' frames and its scripts to its own.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "same-origin")
	if !h.hostAllowed(r) {
		// Plain text, and nothing of the view: no page, no token.
		hdr.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, "arborui: refused: the request names host %q, which this view does not serve "+
			"(arborui.Options.AllowedHosts, or arbor ui --allowed-host, adds a name)\n", r.Host)
		return
	}
	if h.opts.Prefix != "" {
		rest, ok := strings.CutPrefix(r.URL.Path, h.opts.Prefix)
		if !ok || (rest != "" && rest[0] != '/') {
			http.NotFound(w, r)
			return
		}
		if rest == "" {
			http.Redirect(w, r, h.opts.Prefix+"/", http.StatusMovedPermanently)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path, u.RawPath = rest, ""
		r2.URL = &u
		r = r2
	}
	// One reading of the query for every route, page and stream alike:
	// what the database would refuse in its own words, or a stream would
	// fail on after its 200, is refused here in arbor's. (A POST's is read
	// by allowed, after the checks that refuse it with 403.)
	if r.Method != http.MethodPost {
		if err := checkQuery(r.URL.RawQuery); err != nil {
			h.errPage(w, r, err)
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}

// maxQuery bounds the query of an address: the longest the view writes —
// a cursor of the approvals, which holds a conversation id and an event
// name of 200 bytes each, escaped — is a few KiB.
const maxQuery = 8 << 10

// checkQuery refuses a query that is longer than maxQuery, that does not
// parse (a bad escape, a semicolon: which r.URL.Query would drop without
// a word), or whose names and values are not text: invalid UTF-8 or a
// NUL, which no id, name or cursor of arbor's holds (PostgreSQL cannot
// store them).
func checkQuery(raw string) error {
	if len(raw) > maxQuery {
		return badRequest("the address's query is %d bytes, over the limit of %d: no address of this view is that long", len(raw), maxQuery)
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return badRequest("the address's query does not parse: %v", err)
	}
	return checkValues("the address's query", q)
}

// checkValues refuses a query's or a form's name or value that is not
// text: invalid UTF-8, or a NUL. where names it: "the address's query",
// "the form".
func checkValues(where string, vs url.Values) error {
	for name, values := range vs {
		if !isText(name) {
			return badRequest("in %s, the name %s is not text (not UTF-8, or holding a NUL)", where, strconv.Quote(truncate(name, 40)))
		}
		for _, v := range values {
			if !isText(v) {
				return badRequest("in %s, %s=%s is not text (not UTF-8, or holding a NUL)", where, name, strconv.Quote(truncate(v, 80)))
			}
		}
	}
	return nil
}

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// errPage answers a request that failed: a 4xx with arbor's error, which
// says what was wrong with the request; a 5xx with a line only (the error
// goes to the log).
func (h *handler) errPage(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	msg := err.Error()
	switch {
	case code >= 500:
		h.opts.Logger.Error("arborui: request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		msg = http.StatusText(code)
		if code == http.StatusServiceUnavailable {
			msg = "the database is unavailable; try again"
		}
	case errors.Is(err, arbortype.ErrAwaitEnded):
		msg = "This await is over — answered, timed out, woken or aborted, or its task has moved on — so the answer was not sent, " +
			"and nothing was written. (" + msg + ")"
	}
	var buf bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&buf, "error.html", h.page(code, msg)); err != nil {
		h.opts.Logger.Error("arborui: render failed", slog.String("template", "error.html"), slog.Any("error", err))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(scrub(buf.Bytes()))
}

// asset serves one of the embedded assets by name; anything else,
// the folder itself included, is 404: the folder is not listed.
func (h *handler) asset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	f, err := fs.Stat(files, "assets/"+name)
	if err != nil || !f.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	http.ServeFileFS(w, r, files, "assets/"+name)
}

// requestError is a request the handler refuses before it reaches the
// engine, with its HTTP status.
type requestError struct {
	code int
	msg  string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// statusOf maps an error to the HTTP status that says who must act.
func statusOf(err error) int {
	var re *requestError
	switch {
	case errors.As(err, &re):
		return re.code
	case errors.Is(err, arbortype.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, arbortype.ErrInvalidArgument), errors.Is(err, arbortype.ErrInvalidJSON),
		errors.Is(err, arbortype.ErrPayloadTooLarge), errors.Is(err, arbortype.ErrForeignTask):
		return http.StatusBadRequest
	case errors.Is(err, arbortype.ErrInvalidTransition), errors.Is(err, arbortype.ErrNotSleeping),
		errors.Is(err, arbortype.ErrSettled), errors.Is(err, arbortype.ErrAwaitEnded):
		return http.StatusConflict
	case errors.Is(err, arbortype.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
