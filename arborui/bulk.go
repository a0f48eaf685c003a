package arborui

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/arborhq/arbor/tasks"
)

// Bulk actions on the conversations selected in the list (with actions
// on, under the same token and origin rules as every action): abort —
// every live task of each (AbortConversation) — or cancel — each one's
// live turns (root tasks), the newest first, so that a queued turn does
// not start when the one before it ends (Cancel, whose foreground
// children are aborted first) — or rerun — each one's newest turn, from
// its checkpoint, when it failed, was aborted or cancelled and was not
// rerun already (Rerun). Each conversation is acted on in a
// transaction of its own: one that fails (a turn completing already, a
// conversation gone) does not undo the others, and the answer says which
// were done and which not.

// bulkMost is the most conversations one bulk action takes: a page of
// the list at most.
const bulkMost = 1000

func (h *handler) bulk(w http.ResponseWriter, r *http.Request) {
	if !h.allowed(w, r) {
		return
	}
	var ids []string
	for _, id := range r.PostForm["id"] {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	action := r.PostFormValue("action")
	switch {
	case action != "abort" && action != "cancel" && action != "rerun":
		h.errPage(w, r, badRequest("action %q is not one of: abort, cancel, rerun", truncate(action, 40)))
		return
	case len(ids) == 0:
		h.errPage(w, r, badRequest("no conversation selected: tick those to %s in the list", action))
		return
	case len(ids) > bulkMost:
		h.errPage(w, r, badRequest("%d conversations selected, over the %d one action takes", len(ids), bulkMost))
		return
	}
	var opts []tasks.AbortOption
	if reason := strings.TrimSpace(r.PostFormValue("reason")); reason != "" {
		opts = append(opts, tasks.WithReason(reason))
	}
	ctx := r.Context()
	var failed []string
	code := 0
	for _, conv := range ids {
		var err error
		switch action {
		case "abort":
			_, err = h.engine.AbortConversation(ctx, conv, opts...)
		case "rerun":
			var last int64
			if last, err = h.reader.NewestRootID(ctx, conv); err == nil {
				if _, err = h.engine.Rerun(ctx, last); err != nil {
					err = fmt.Errorf("turn #%d: %w", last, err)
				}
			}
		case "cancel":
			var roots []int64
			if _, err = h.engine.Conversation(ctx, conv); err != nil {
				break
			}
			if roots, err = h.reader.LiveRootIDs(ctx, conv, bulkMost); err == nil {
				for _, id := range slices.Backward(roots) {
					if _, err = h.engine.Cancel(ctx, id, nil); err != nil {
						err = fmt.Errorf("turn #%d: %w", id, err)
						break
					}
				}
			}
		}
		if err != nil {
			if c := statusOf(err); c >= 500 {
				h.errPage(w, r, fmt.Errorf("%s conversation %q: %w", action, conv, err))
				return
			} else if code == 0 || c > code {
				code = c
			}
			failed = append(failed, fmt.Sprintf("%s: %v", conv, err))
		}
	}
	if len(failed) > 0 {
		h.errPage(w, r, &requestError{code: code, msg: fmt.Sprintf("%s: %d of %d conversations done; not done: %s",
			action, len(ids)-len(failed), len(ids), strings.Join(failed, "; "))})
		return
	}
	h.back(w, r, h.opts.Prefix+"/")
}
