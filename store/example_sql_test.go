package store_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"strings"

	"github.com/arborhq/arbor/store"
)

// ExampleSQL lists the statements of one file of arbor's SQL: the holders',
// the conversation leases' and the maintenance leader's.
func ExampleSQL() {
	b, err := fs.ReadFile(store.SQL, "queries/lease.sql")
	if err != nil {
		fmt.Println(err)
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "-- name: "); ok {
			fmt.Println(name)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// NewHolder
	// DatabaseIdentity
	// EndDeadHolder
	// RenewHolder
	// EndHolder
	// PruneHolders
	// TakeConversation
	// LockHeldConversation
	// TryLockHeldConversation
	// ReleaseConversation
	// FenceConversation
	// Leader
	// LockLeader
	// TakeLeader
}
