package arbortype

import "time"

// Tenant is a tenant given a weight in the fair claim (tasks.Engine's
// SetTenantWeight): a tenant of weight w gets w places in each round of
// the claim's round robin. A tenant with no row weighs 1.
type Tenant struct {
	Name      string
	Weight    int
	UpdatedAt time.Time
}

// ConcurrencyLimit bounds how many tasks of a key run at once, across every
// node (tasks.Engine's SetConcurrencyLimit). Key is "tenant:<tenant>" (the
// tasks of a tenant), "kind:<kind>" (of a kind) or "key:<key>" (the tasks
// created with that CreateParams.ConcurrencyKey: a tool, a model provider).
// Running is how many runs hold a slot of it now.
type ConcurrencyLimit struct {
	Key       string
	Max       int
	Running   int
	UpdatedAt time.Time
}
