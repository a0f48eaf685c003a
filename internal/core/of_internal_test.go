package core

import (
	"runtime"
	"testing"
	"weak"

	"github.com/stretchr/testify/require"
)

// fakePublic stands for a *tasks.Engine: it holds a pointer, so it is not
// a tiny allocation, whose cleanup may never run.
type fakePublic struct{ c *Engine }

// Of finds the engine registered behind a public engine, nothing behind
// another or a nil one, and forgets the entry once the public engine is
// garbage.
func TestOfFindsRegisteredEngines(t *testing.T) {
	t.Parallel()
	c := &Engine{}
	pub, other := &fakePublic{c: c}, &fakePublic{c: c}
	Register(pub, c)
	require.Same(t, c, Of(pub))
	require.Nil(t, Of(other))
	require.Nil(t, Of[fakePublic](nil))

	key := weak.Make(pub)
	runtime.KeepAlive(pub)
	pub = nil
	for {
		if _, ok := engines.Load(key); !ok {
			break
		}
		runtime.GC()
		runtime.Gosched()
	}
	runtime.KeepAlive(other)
}
