package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// demoHandlers are the demo's task kinds: a chat turn and what it calls.
//
// A "chat_turn" runs in phases, resuming from its saved phase each time it is
// woken: it fans out three tool calls and waits for all of them
// (all_settled), one of which sleeps for a rate limit; then it asks three
// translators at once and gives up on the others at the first failure
// (fail_fast); then it answers. A "research" turn runs a sub-agent that
// browses until the user stops it. A "long" turn runs steps that take a
// while, so that the demo can kill its worker in the middle.
func demoHandlers() map[string]machine.Handler {
	work := func(d time.Duration) machine.Handler {
		return func(ctx context.Context, run *machine.Run) error {
			if err := busy(ctx, run, d); err != nil {
				return err
			}
			return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"took_ms": %d}`, d.Milliseconds())))
		}
	}
	return map[string]machine.Handler{
		"chat_turn":    chatTurn,
		"search_web":   work(300 * time.Millisecond),
		"read_docs":    work(500 * time.Millisecond),
		"translate_en": work(200 * time.Millisecond),
		"translate_de": work(10 * time.Second), // aborted by fail_fast long before
		"long_step":    work(2 * time.Second),
		"browse":       work(time.Minute), // stopped by the user
		"translate_fr": func(ctx context.Context, run *machine.Run) error {
			// Long enough for the demo's watch (a poll every 100 ms) to
			// show the turn waiting fail_fast before this fails it.
			if err := busy(ctx, run, 700*time.Millisecond); err != nil {
				return err
			}
			return fmt.Errorf("%w: translation service rejected the text", arbortype.ErrNonRetryable)
		},
		"rate_limited_api": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "backoff" {
				return run.Complete(ctx, json.RawMessage(`{"weather": "sunny"}`))
			}
			// 429: come back in a second. The task sleeps; a River job and a
			// local timer wake it.
			return run.SleepUntil(ctx, time.Now().Add(time.Second), "backoff", nil)
		},
		// A sub-agent that needs a human's approval before it acts: it tells
		// the client (progress), parks until the "approval" event (the
		// token in arbor pending answers it), and acts on the answer.
		"mail_agent": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "decided" {
				var answer struct {
					Approved bool `json:"approved"`
				}
				if d := run.Task.Delivered; d != nil && !d.TimedOut {
					_ = json.Unmarshal(d.Payload, &answer)
				}
				return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"sent": %t}`, answer.Approved)))
			}
			if err := run.Progress(ctx, "status", json.RawMessage(`"waiting for approval to send the email"`)); err != nil {
				return err
			}
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval", Timeout: 5 * time.Minute, Phase: "decided"})
		},
		"research_agent": func(ctx context.Context, run *machine.Run) error {
			ids, err := spawnAll(ctx, run, "browse", "browse")
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "browsing"})
		},
	}
}

func chatTurn(ctx context.Context, run *machine.Run) error {
	var in struct {
		Mode string `json:"mode"`
	}
	_ = json.Unmarshal(run.Task.Input, &in)
	switch {
	case in.Mode == "stream":
		// A long answer, streamed token by token to whoever follows the
		// conversation; the next message interrupts it.
		for _, tok := range []string{"Let", " me", " think", " about", " that", " for", " a", " long", " while", "..."} {
			if err := run.Progress(ctx, "token", json.RawMessage(fmt.Sprintf("%q", tok))); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(400 * time.Millisecond):
			}
		}
		return run.Complete(ctx, json.RawMessage(`{"answer": "a long one"}`))
	case in.Mode == "quick":
		if err := run.Progress(ctx, "token", json.RawMessage(`"Sure: 42."`)); err != nil {
			return err
		}
		return run.Complete(ctx, json.RawMessage(`{"answer": "42"}`))
	case in.Mode == "approval" && run.Task.Phase == "":
		ids, err := spawnAll(ctx, run, "mail_agent")
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "mailing"})
	case in.Mode == "approval":
		return run.Complete(ctx, json.RawMessage(`{"answer": "the email is sent"}`))
	case in.Mode == "research" && run.Task.Phase == "":
		ids, err := spawnAll(ctx, run, "research_agent")
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "researching"})
	case in.Mode == "long" && run.Task.Phase == "":
		ids, err := spawnAll(ctx, run, "long_step", "long_step", "long_step")
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "working"})
	case in.Mode == "long", in.Mode == "research":
		return run.Complete(ctx, json.RawMessage(`{"answer": "done"}`))
	}
	switch run.Task.Phase {
	case "":
		if err := run.Checkpoint(ctx, "planning", json.RawMessage(`{"plan": ["search", "docs", "weather"]}`)); err != nil {
			return err
		}
		ids, err := spawnAll(ctx, run, "search_web", "read_docs", "rate_limited_api")
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "tools"})
	case "tools":
		ids, err := spawnAll(ctx, run, "translate_en", "translate_fr", "translate_de")
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.FailFast, Phase: "translating"})
	case "translating":
		waited, err := run.Waited(ctx)
		if err != nil {
			return err
		}
		done := 0
		for _, t := range waited {
			if t.Status == "completed" {
				done++
			}
		}
		return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"answer": "here is what I found", "translations": %d}`, done)))
	}
	return fmt.Errorf("%w: unknown phase %q", arbortype.ErrNonRetryable, run.Task.Phase)
}

// spawnAll creates one child per kind, each with an idempotency key so a
// re-run after a crash finds the children the first run made.
func spawnAll(ctx context.Context, run *machine.Run, kinds ...string) ([]int64, error) {
	ps := make([]machine.SpawnParams, len(kinds))
	for i, kind := range kinds {
		ps[i] = machine.SpawnParams{Kind: kind, IdempotencyKey: fmt.Sprintf("%d/%s/%s/%d", run.Task.ID, run.Task.Phase, kind, i)}
	}
	kids, err := run.SpawnMany(ctx, ps) // one write for all of them
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(kids))
	for i, c := range kids {
		ids[i] = c.ID
	}
	return ids, nil
}

// busy works for d, heartbeating, and stops early when the task is stopped.
func busy(ctx context.Context, run *machine.Run, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(min(200*time.Millisecond, time.Until(deadline))):
		}
		if err := run.Heartbeat(ctx); err != nil {
			if errors.Is(err, arbortype.ErrAborted) || errors.Is(err, arbortype.ErrNotRunning) {
				return err
			}
		}
	}
	return nil
}
