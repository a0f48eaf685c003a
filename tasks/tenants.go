package tasks

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// SetTenantWeight sets a tenant's weight in the fair claim, 1 to 1000 (a
// tenant never given one weighs 1): under contention the runners take
// pending work round robin across tenants, a tenant of weight w getting w
// places per round (docs/design.md §3.15). A weight outside 1..1000, or a
// tenant name over 200 bytes, is arbortype.ErrInvalidArgument, and nothing
// is written.
func (e *Engine) SetTenantWeight(ctx context.Context, tenant string, weight int) error {
	return core.SetTenantWeight(ctx, e.core, tenant, weight)
}

// Tenants lists the tenants given a weight, by name.
func (e *Engine) Tenants(ctx context.Context) ([]arbortype.Tenant, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Tenant, error) { return e.core.Store.Tenants(ctx, db) })
}

// SetConcurrencyLimit bounds how many tasks of key run at once across every
// node: key is "tenant:<tenant>", "kind:<kind>" or "key:<key>" (the tasks
// created with that arbortype.CreateParams.ConcurrencyKey, or spawned with
// that machine.SpawnParams.ConcurrencyKey). A task is started only with a
// free slot of every limit of its keys, taken in the start's transaction
// and given back in the one that ends its run (a completion, a wait, a
// sleep, a failure, or the take-over of a node that died): the limit is
// never exceeded, and no slot is leaked. A task held back stays pending,
// and starts when a slot is free (within the runners' PollInterval). A new
// limit counts the runs of its key already under way; lowering one stops
// nothing that runs. A malformed key or a max below 0 is
// arbortype.ErrInvalidArgument, and nothing is written.
func (e *Engine) SetConcurrencyLimit(ctx context.Context, key string, max int) error {
	return core.SetConcurrencyLimit(ctx, e.core, key, max)
}

// DeleteConcurrencyLimit removes a concurrency limit; arbortype.ErrNotFound
// when there is none.
func (e *Engine) DeleteConcurrencyLimit(ctx context.Context, key string) error {
	return core.DeleteConcurrencyLimit(ctx, e.core, key)
}

// ConcurrencyLimits lists the concurrency limits by key, each with how many
// runs hold a slot of it now.
func (e *Engine) ConcurrencyLimits(ctx context.Context) ([]arbortype.ConcurrencyLimit, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.ConcurrencyLimit, error) { return e.core.Store.Limits(ctx, db) })
}
