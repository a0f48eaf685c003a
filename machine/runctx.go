package machine

import (
	"context"
	"time"
)

// fencedCtx is a handler's context: a cancelable context whose Err also
// checks the node's lease against the local clock, and fires the fence
// when it is past. A process resumed from a freeze (SIGSTOP, a VM paused)
// runs its goroutines in no particular order; a handler that checks
// ctx.Err() before a side effect sees its context cancelled at once, even
// before the fence's own timer goroutine has run. Done, Value and Cause are
// the inner context's (context.Cause finds its cancel cause through Value).
type fencedCtx struct {
	context.Context
	lease *nodeLease
}

func (c fencedCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !c.lease.checkFence(time.Now()) {
		// fire cancelled every handler's context, this one's too.
		return c.Context.Err()
	}
	return nil
}
