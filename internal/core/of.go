package core

import (
	"runtime"
	"sync"
	"weak"
)

// The engines behind the users' engines: package tasks registers each
// *tasks.Engine it makes (Register, in tasks.New), and the packages that run
// tasks (machine, arbortest, the benchmarks) look the engine up (Of) to reach
// the operations that are not on the user's Engine. A registry and not a
// field, because a *tasks.Engine's fields are package tasks' own; a call in
// New and not a function variable set by an init, so that the wiring is a
// call one can follow. An entry lasts as long as its *tasks.Engine: it is
// keyed by a weak pointer and removed by a cleanup once the engine is
// garbage, so a process that makes many engines (a test suite) keeps none.
var engines sync.Map // weak.Pointer[T] → *Engine

// Register records c as the engine behind pub (a *tasks.Engine).
func Register[T any](pub *T, c *Engine) {
	key := weak.Make(pub)
	engines.Store(key, c)
	runtime.AddCleanup(pub, func(key weak.Pointer[T]) { engines.Delete(key) }, key)
}

// Of returns the engine behind pub (a *tasks.Engine), or nil for a nil one
// or one that tasks.New did not make.
func Of[T any](pub *T) *Engine {
	if pub == nil {
		return nil
	}
	c, _ := engines.Load(weak.Make(pub))
	e, _ := c.(*Engine)
	return e
}
