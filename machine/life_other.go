//go:build !linux

package machine

import (
	"errors"
	"os"
)

// localFilesystem: life locks are used on Linux only, where the
// filesystem's type tells a local disk from a network share.
func localFilesystem(string) error {
	return errors.New("life locks are used on Linux only")
}

// tryLock is never called: no life lock is made off Linux.
func tryLock(*os.File) error { return errors.New("life locks are used on Linux only") }
