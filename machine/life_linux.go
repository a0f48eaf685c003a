package machine

import (
	"fmt"
	"os"
	"syscall"
)

// localFilesystems are the filesystem types (statfs's f_type) on which a
// flock is the host's own: granted by this kernel, to processes of this
// host only, and dropped when its process dies. Over NFS, SMB or 9p a lock
// can be granted while the process that held it lives on another host, or
// be emulated by the server: such a proof could be wrong.
var localFilesystems = map[int64]string{
	0xEF53:     "ext2/3/4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0x794C7630: "overlayfs",
	0x2FC12FC1: "zfs",
	0xF2F52010: "f2fs",
}

// localFilesystem refuses a directory that is not on a local filesystem.
func localFilesystem(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	if _, ok := localFilesystems[int64(st.Type)]; !ok {
		return fmt.Errorf("%s is on a filesystem (type %#x) that is not known to be local to this host", dir, st.Type)
	}
	return nil
}

// tryLock takes an exclusive flock on f without waiting.
func tryLock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
