package arborui

import (
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/arborhq/arbor/tasks"
)

// Defaults of Options.
const (
	// RecentLimitDefault is how many recent conversations the front page
	// lists.
	RecentLimitDefault = 20
	// LiveLimitDefault is how many conversations with live work the front
	// page lists.
	LiveLimitDefault = 200
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
	// reason), cancel, wake and emit. Default false: the view is read-only,
	// shows no action, refuses every POST with 403 and hides await tokens
	// (a token answers an approval). Turn it on only behind your own
	// authentication: the handler authenticates nobody, it only checks
	// that a POST carries its token and comes from its own origin.
	Actions bool
	// RecentLimit is how many recent conversations the front page lists
	// (1..1000). Default RecentLimitDefault (20).
	RecentLimit int
	// LiveLimit is how many conversations with live work the front page
	// lists (1..10,000). Default LiveLimitDefault (200).
	LiveLimit int
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
	if out.LiveLimit == 0 {
		out.LiveLimit = LiveLimitDefault
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
	if strings.ContainsAny(o.Prefix, "?#%\"'<> ") {
		return fmt.Errorf("Options.Prefix: %q has a character a path prefix cannot have", o.Prefix)
	}
	if o.RecentLimit < 1 || o.RecentLimit > 1000 {
		return fmt.Errorf("Options.RecentLimit: %d is outside 1..1000", o.RecentLimit)
	}
	if o.LiveLimit < 1 || o.LiveLimit > 10000 {
		return fmt.Errorf("Options.LiveLimit: %d is outside 1..10000", o.LiveLimit)
	}
	return nil
}

//go:embed assets templates
var files embed.FS

// handler serves the view of one Engine.
type handler struct {
	engine *tasks.Engine
	opts   *Options
	// csrf is the token every action's form carries; a POST without it is
	// refused. It is new with every handler, so a form of another process
	// (or of this one before a restart) is refused too.
	csrf string
	tmpl *template.Template
	mux  *http.ServeMux
}

// NewHandler returns the web view of engine, to mount in your own server
// under opts.Prefix (see Options). An invalid option is an error naming the
// field, wrapping tasks.ErrInvalidArgument.
func NewHandler(engine *tasks.Engine, opts *Options) (http.Handler, error) {
	if engine == nil {
		return nil, fmt.Errorf("arborui.NewHandler: engine is nil: %w", tasks.ErrInvalidArgument)
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("arborui.NewHandler: %w: %w", tasks.ErrInvalidArgument, err)
	}
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	tmpl, err := template.New("").Funcs(funcs).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("arborui.NewHandler: templates: %w", err)
	}
	h := &handler{engine: engine, opts: opts, csrf: hex.EncodeToString(b[:]), tmpl: tmpl, mux: http.NewServeMux()}
	assets, _ := fs.Sub(files, "assets")
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	h.mux.HandleFunc("GET /{$}", h.index)
	h.mux.HandleFunc("GET /conversation", h.conversation)
	h.mux.HandleFunc("GET /conversation/live", h.conversationLive)
	h.mux.HandleFunc("GET /tasks/{id}", h.task)
	h.mux.HandleFunc("GET /tasks/{id}/live", h.taskLive)
	h.mux.HandleFunc("POST /tasks/{id}/{action}", h.taskAction)
	h.mux.HandleFunc("POST /conversation/{action}", h.conversationAction)
	return h, nil
}

// ServeHTTP strips the prefix and serves the view, with headers that keep
// its pages out of other sites' frames and its scripts to its own.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "same-origin")
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
	h.mux.ServeHTTP(w, r)
}

// errPage answers a request that failed: a 4xx with arbor's error, which
// says what was wrong with the request; a 5xx with a line only (the error
// goes to the log).
func (h *handler) errPage(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	msg := err.Error()
	if code >= 500 {
		h.opts.Logger.Error("arborui: request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		msg = http.StatusText(code)
		if code == http.StatusServiceUnavailable {
			msg = "the database is unavailable; try again"
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_ = h.tmpl.ExecuteTemplate(w, "error.html", h.page(code, msg))
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
	case errors.Is(err, tasks.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, tasks.ErrInvalidArgument), errors.Is(err, tasks.ErrInvalidJSON),
		errors.Is(err, tasks.ErrPayloadTooLarge), errors.Is(err, tasks.ErrForeignTask):
		return http.StatusBadRequest
	case errors.Is(err, tasks.ErrInvalidTransition), errors.Is(err, tasks.ErrNotSleeping),
		errors.Is(err, tasks.ErrSettled), errors.Is(err, tasks.ErrAwaitEnded):
		return http.StatusConflict
	case errors.Is(err, tasks.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
