package machine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

// A conversation's tasks are run by one holder at a time: a Runner's node,
// or a caller holding a Lease. A Lease is for code that runs tasks itself
// (a test, a one-off script, a worker of your own design): it takes the
// conversation's lease the way a Runner does — recovering whatever the
// holder before it left running — and starts tasks under it, fenced by its
// epoch. While a Lease is live no Runner touches the conversation, and a
// Lease cannot be taken while a Runner (or another Lease) holds it.

// LeaseConfig configures a Lease. The zero value of every field means its
// default.
type LeaseConfig struct {
	// Holder names the lease's holder, as arbor ls shows it. Each Lease is
	// a holder of its own (a row of the holders table), whatever its name:
	// two Leases given the same name do not renew each other. Default:
	// hostname, pid and a random suffix.
	Holder string
	// Duration is the conversation lease: it expires this long after the
	// last Renew, and only then can another holder take the conversation
	// (recovering its running tasks, counted as restarts). A Renew after it
	// expired is refused (arbortype.ErrLeaseLost): take a new Lease. Default
	// ConversationLeaseDefault.
	Duration time.Duration
}

// Lease is a caller's hold on one conversation (see LeaseConfig). It is
// safe for concurrent use.
type Lease struct {
	core   *core.Engine
	lease  core.Lease
	ttl    time.Duration
	report reconcile.Report
}

func defaultHolder() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// AcquireLease takes the lease of a conversation for the caller and
// recovers it in the same transaction (Report says what recovery did). It
// is arbortype.ErrLeaseHeld when a Runner or another Lease holds the
// conversation, arbortype.ErrNotFound when the conversation does not exist.
func AcquireLease(ctx context.Context, engine *tasks.Engine, conversationID string, cfg *LeaseConfig) (*Lease, error) {
	c := core.Of(engine)
	if c == nil {
		return nil, fmt.Errorf("machine.AcquireLease: engine is nil: %w", arbortype.ErrInvalidArgument)
	}
	var conf LeaseConfig
	if cfg != nil {
		conf = *cfg
	}
	if conf.Holder == "" {
		conf.Holder = defaultHolder()
	}
	if conf.Duration == 0 {
		conf.Duration = ConversationLeaseDefault
	}
	if len(conf.Holder) > 200 {
		return nil, fmt.Errorf("machine.AcquireLease: LeaseConfig.Holder is over 200 bytes: %w", arbortype.ErrInvalidArgument)
	}
	if conf.Duration < 100*time.Millisecond || conf.Duration > 24*time.Hour {
		return nil, fmt.Errorf("machine.AcquireLease: LeaseConfig.Duration %s is outside 100ms..24h: %w", conf.Duration, arbortype.ErrInvalidArgument)
	}
	l := &Lease{core: c, ttl: conf.Duration}
	_, err := core.Tx(ctx, c, func(tx pgx.Tx) (struct{}, error) {
		// A holder row of the Lease's own (a life): its deadline is the
		// lease's.
		holderID, _, err := c.NewHolder(ctx, tx, conf.Holder, conf.Duration)
		if err != nil {
			return struct{}{}, err
		}
		lease, taken, err := c.TakeLease(ctx, tx, conversationID, conf.Holder, holderID)
		if err != nil {
			return struct{}{}, err
		}
		rep, err := recovery.OnOpen(ctx, c, tx, conversationID, taken.Counted())
		l.lease, l.report = lease, rep
		return struct{}{}, err
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Report says what recovery did when the lease was taken.
func (l *Lease) Report() reconcile.Report { return l.report }

// Epoch is the lease's epoch: every run started under the lease carries it.
func (l *Lease) Epoch() int64 { return l.lease.Epoch }

// Start starts one pending task of the conversation and returns its run.
// arbortype.ErrAlreadyRunning when another run holds it, arbortype.ErrAborted when
// it is being aborted, arbortype.ErrForeignTask for a task of another
// conversation, arbortype.ErrLeaseLost when the lease was taken over.
func (l *Lease) Start(ctx context.Context, taskID int64) (*Run, error) {
	t, err := core.Tx(ctx, l.core, func(tx pgx.Tx) (core.Task, error) { return l.core.Start(ctx, tx, l.lease, taskID) })
	if err != nil {
		return nil, err
	}
	return newRun(l.core, directSink{l.core}, t), nil
}

// Claim starts up to limit runnable tasks of the conversation, oldest
// first, following the generation rule (at most one root task runs at a
// time: the one under way, or else the oldest pending one), and returns
// their runs.
func (l *Lease) Claim(ctx context.Context, limit int) ([]*Run, error) {
	ts, err := core.Tx(ctx, l.core, func(tx pgx.Tx) ([]core.Task, error) {
		roots, err := l.core.Store.LiveRoots(ctx, tx, l.lease.ConversationID)
		if err != nil {
			return nil, fmt.Errorf("claim in conversation %q: %w", l.lease.ConversationID, err)
		}
		return l.core.Claim(ctx, tx, l.lease, core.ClaimParams{Roots: generations(roots, nil), Limit: limit})
	})
	if err != nil {
		return nil, err
	}
	runs := make([]*Run, len(ts))
	for i, t := range ts {
		runs[i] = newRun(l.core, directSink{l.core}, t)
	}
	return runs, nil
}

// Renew extends the lease by its Duration. arbortype.ErrLeaseLost when it was
// taken over (it had expired).
func (l *Lease) Renew(ctx context.Context) error {
	live, err := core.Read(ctx, l.core, func(db store.DB) (bool, error) {
		return l.core.RenewHolder(ctx, db, l.lease.HolderID, l.ttl)
	})
	if err != nil {
		return fmt.Errorf("renew the lease of conversation %q: %w", l.lease.ConversationID, err)
	}
	if !live {
		// Expired: another holder may have taken the conversation. Even if
		// none did, the lease is not revived: take a new one.
		return fmt.Errorf("renew the lease of conversation %q: it expired: %w", l.lease.ConversationID, arbortype.ErrLeaseLost)
	}
	return nil
}

// Release gives the conversation up. Tasks still running under the lease
// are recovered in the same transaction (back to pending, not counted as a
// restart: the holder gave them up; or abandoned when abandon_on_restart),
// so that no run of the lease can write after Release returns.
// arbortype.ErrLeaseLost when the lease was taken over already.
func (l *Lease) Release(ctx context.Context) error {
	_, err := release(ctx, l.core, l.lease, nil)
	if err == nil {
		// The holder row goes too, whatever ctx does now: the release
		// landed, and a row left would wait to expire (a failure here only
		// leaves it to the prune of long-expired holders).
		ectx := context.WithoutCancel(ctx)
		_, _ = core.Read(ectx, l.core, func(db store.DB) (bool, error) {
			return l.core.EndHolder(ectx, db, l.lease.HolderID)
		})
	}
	return err
}
