// Package inspect holds the operator's reads of the web view (package
// arborui) and of the arbor command: each reads at most a bounded number
// of rows and pages by keyset — the key of the last row a page returned,
// never an OFFSET — so that a page costs the same over 100,000
// conversations as over ten. They are not part of the public API: an
// application reads its tasks through tasks.Engine; a team that builds its
// own dashboard mounts arborui's handler, or reads the tables that
// docs/design.md describes.
package inspect

import (
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// Reader reads an engine's schema for the web view.
type Reader struct {
	core *core.Engine
}

// New returns the reader of engine's schema, on engine's pool.
func New(engine *tasks.Engine) *Reader { return &Reader{core: core.Of(engine)} }
