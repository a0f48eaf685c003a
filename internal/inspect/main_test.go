package inspect_test

import (
	"os"
	"testing"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestMain fails the package if goroutines outlive its tests.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
