package migrations_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// released pins the text of every migration a release shipped (CHANGELOG.md),
// by its files' SHA-256: a schema that applied one must find the same SQL in
// every later build, so a released migration never changes. A change to
// the schema, or to the rules the guards are generated from
// (internal/guardrules; go generate ./fsm writes the newest migration that
// holds a guard's region), comes as a new migration; a migration joins this
// list when a release ships it.
var released = map[string]string{
	"001_baseline.up.sql":   "ae462a0cc36650517e94c2167a07b2fcec34ca933b8cae481a5b845523a83fc3", // v0.1.0
	"001_baseline.down.sql": "ee9b6d8364844d476ecc385585263e71372a7e54ed7b1f7df63618a6749e3b26", // v0.1.0
}

func TestReleasedMigrationsNeverChange(t *testing.T) {
	t.Parallel()
	for name, want := range released {
		b, err := os.ReadFile(filepath.Join("sql", name))
		require.NoError(t, err, "a released migration is never removed")
		sum := sha256.Sum256(b)
		require.Equal(t, want, hex.EncodeToString(sum[:]),
			"migrations/sql/%s changed, and a release shipped it: write a new migration instead (for a guard, one that holds the guard's region, which go generate ./fsm then writes)", name)
	}
}
