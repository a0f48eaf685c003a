package arborui

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/arborhq/arbor/internal/awaittoken"
	"github.com/arborhq/arbor/tasks"
)

// maxForm bounds an action's form: an event's payload (64 KiB) and the rest.
const maxForm = 128 << 10

// allowed says whether r may act: actions are on, and r is a same-origin
// POST carrying the handler's token. A cross-site form cannot know the
// token (it is in the handler's pages only, which another origin cannot
// read); the origin check refuses it even where the token leaked into a
// copied page.
func (h *handler) allowed(w http.ResponseWriter, r *http.Request) bool {
	if !h.opts.Actions {
		h.errPage(w, r, &requestError{code: http.StatusForbidden,
			msg: "actions are disabled: this view is read-only (arbor ui --actions, or arborui.Options.Actions, enables them)"})
		return false
	}
	if !sameOrigin(r) {
		h.errPage(w, r, &requestError{code: http.StatusForbidden, msg: "refused: the request did not come from this view's own pages"})
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		h.errPage(w, r, badRequest("the form could not be read: %v", err))
		return false
	}
	token := r.PostFormValue("csrf")
	if subtle.ConstantTimeCompare([]byte(token), []byte(h.csrf)) != 1 {
		h.errPage(w, r, &requestError{code: http.StatusForbidden,
			msg: "refused: the form's token is missing or stale (reload the page and try again)"})
		return false
	}
	if err := checkQuery(r.URL.RawQuery); err != nil {
		h.errPage(w, r, err)
		return false
	}
	if err := checkValues("the form", r.PostForm); err != nil {
		h.errPage(w, r, err)
		return false
	}
	return true
}

func (h *handler) taskAction(w http.ResponseWriter, r *http.Request) {
	if !h.allowed(w, r) {
		return
	}
	id, err := taskID(r)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	ctx := r.Context()
	switch action := r.PathValue("action"); action {
	case "abort":
		var opts []tasks.AbortOption
		if reason := strings.TrimSpace(r.PostFormValue("reason")); reason != "" {
			opts = append(opts, tasks.WithReason(reason))
		}
		_, err = h.engine.Abort(ctx, id, opts...)
	case "cancel":
		var result json.RawMessage
		if result, err = payload(r, "result"); err == nil {
			_, err = h.engine.Cancel(ctx, id, result)
		}
	case "wake":
		_, err = h.engine.WakeNow(ctx, id)
	case "emit":
		err = h.emitToTask(r, id)
	case "raise":
		err = h.raise(r, id)
	case "rerun":
		// The rerun is a new task: its page is where to look next.
		rerun, err := h.engine.Rerun(ctx, id)
		if err != nil {
			h.errPage(w, r, err)
			return
		}
		http.Redirect(w, r, fmt.Sprintf("%s/tasks/%d", h.opts.Prefix, rerun.ID), http.StatusSeeOther)
		return
	default:
		h.errPage(w, r, &requestError{code: http.StatusNotFound, msg: fmt.Sprintf("no action %q (abort, cancel, wake, emit, raise, rerun)", action)})
		return
	}
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.back(w, r, fmt.Sprintf("%s/tasks/%d", h.opts.Prefix, id))
}

func (h *handler) conversationAction(w http.ResponseWriter, r *http.Request) {
	if !h.allowed(w, r) {
		return
	}
	// The id travels in the form's address (percent-encoded, so that no
	// character of it is changed on the way), or in its field.
	conv := r.URL.Query().Get("id")
	if conv == "" {
		conv = r.PostFormValue("id")
	}
	if conv == "" {
		h.errPage(w, r, badRequest("no conversation: the form needs its id"))
		return
	}
	ctx := r.Context()
	var err error
	switch action := r.PathValue("action"); action {
	case "abort":
		var opts []tasks.AbortOption
		if reason := strings.TrimSpace(r.PostFormValue("reason")); reason != "" {
			opts = append(opts, tasks.WithReason(reason))
		}
		_, err = h.engine.AbortConversation(ctx, conv, opts...)
	case "emit":
		var p json.RawMessage
		if p, err = payload(r, "payload"); err == nil {
			_, _, err = h.engine.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: r.PostFormValue("name"),
				Payload: p, Queue: r.PostFormValue("queue") != ""})
		}
	default:
		h.errPage(w, r, &requestError{code: http.StatusNotFound, msg: fmt.Sprintf("no action %q (abort, emit)", action)})
		return
	}
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.back(w, r, h.opts.Prefix+"/conversation?id="+url.QueryEscape(conv))
}

// emitToTask emits the form's event to task id, or answers the await
// whose token the form carries. An answer with a decision (approve or
// deny: the approvals' buttons) is its payload, a JSON object or none,
// with "approved" set to true or false.
func (h *handler) emitToTask(r *http.Request, id int64) error {
	p, err := payload(r, "payload")
	if err != nil {
		return err
	}
	if token := r.PostFormValue("token"); token != "" {
		if err := h.tokenOf(r.Context(), id, token); err != nil {
			return err
		}
		if d := r.PostFormValue("decision"); d != "" {
			if p, err = decide(p, d); err != nil {
				return err
			}
		}
		ev, created, err := h.engine.EmitToken(r.Context(), token, p)
		if err == nil && !created {
			// The token's await was answered already: EmitToken returns that
			// answer and writes nothing. Say so rather than pretend this one
			// went through.
			return &requestError{code: http.StatusConflict, msg: fmt.Sprintf(
				"This await was answered already (event #%d, emitted %s), so this answer was not sent, and nothing was written.",
				ev.ID, ev.EmittedAt.UTC().Format("2006-01-02 15:04:05.000Z"))}
		}
		return err
	}
	t, err := h.engine.Get(r.Context(), id)
	if err != nil {
		return err
	}
	_, _, err = h.engine.Emit(r.Context(), tasks.EmitParams{ConversationID: t.ConversationID, TaskID: id,
		Name: r.PostFormValue("name"), Payload: p, Queue: r.PostFormValue("queue") != ""})
	return err
}

// tokenOf refuses an await token that is not one of task id's: a form of
// task A's page carrying conversation B's token (copied, or forged) would
// otherwise answer B's await and send the browser back to A's page, still
// waiting.
//
// A token names its task ("awt_<task id>_<128 random bits>", see
// docs/design.md), and EmitToken answers only the task it names, checking
// under that task's lock, in its own transaction, that the task holds the
// token: so a token naming id answers id or nothing, and needs no read
// here. A token of the older form, which names no task, must be the one
// the task holds now (a separate read, but a token is issued to one task
// only: held by id, it is id's; not held by it, EmitToken could only
// answer another task's await, or none).
func (h *handler) tokenOf(ctx context.Context, id int64, token string) error {
	if named, ok := awaittoken.Task(token); ok {
		if named != id {
			return badRequest("this answer's token is of an await of task #%d, not of task #%d, whose page sent it; "+
				"it was not sent, and nothing was written", named, id)
		}
		return nil
	}
	t, err := h.engine.Get(ctx, id)
	if err != nil {
		return err
	}
	if t.AwaitToken != token {
		return badRequest("this answer's token is not the one of task #%d's await; it was not sent, and nothing was written", id)
	}
	return nil
}

// decide returns payload p (a JSON object, or none) with "approved" set
// as decision says: approve or deny.
func decide(p json.RawMessage, decision string) (json.RawMessage, error) {
	if decision != "approve" && decision != "deny" {
		return nil, badRequest("decision %q is not approve or deny", decision)
	}
	obj := map[string]json.RawMessage{}
	if len(p) > 0 {
		if err := json.Unmarshal(p, &obj); err != nil || obj == nil {
			return nil, badRequest("an approval's payload must be a JSON object: %s", strconv.Quote(truncate(string(p), 80)))
		}
	}
	obj["approved"] = json.RawMessage(strconv.FormatBool(decision == "approve"))
	return json.Marshal(obj)
}

// payload reads a form field holding JSON; empty is none. JSON that does
// not parse is refused here, with the field's name, before anything is
// written.
func payload(r *http.Request, field string) (json.RawMessage, error) {
	s := strings.TrimSpace(r.PostFormValue(field))
	if s == "" {
		return nil, nil
	}
	if !json.Valid([]byte(s)) {
		return nil, badRequest("%s is not JSON: %s", field, strconv.Quote(truncate(s, 80)))
	}
	return json.RawMessage(s), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// back sends the browser, after an action, to the page it acted from (its
// "back" field, a path of this handler's: see localPath), else to
// fallback: a 303, so that a reload does not post again.
func (h *handler) back(w http.ResponseWriter, r *http.Request, fallback string) {
	to := localPath(h.opts.Prefix, r.PostFormValue("back"))
	if to == "" {
		to = fallback
	}
	w.Header().Set("Location", to)
	w.WriteHeader(http.StatusSeeOther)
}
