package faultharness

import (
	"os"
	"testing"

	"github.com/arborhq/arbor/internal/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(m))
}
