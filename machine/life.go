package machine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// lifeLock is a runner's lock file of its current life, and the prover of
// other lives' deaths on the same host (docs/architecture.md, "Proven
// deaths"). A life's file is created locked under a temporary name, filled
// and renamed, so its final name is never seen unlocked; it stays open and
// locked while the life may hold anything. A lock on another life's file
// that this process gets proves that the process that created it has
// exited: the kernel drops a flock only when every descriptor of the
// file's open is closed, and Go opens files close-on-exec.
type lifeLock struct {
	dir    string
	prefix string // the file names of this database and schema start with it
	db     string

	mu   sync.Mutex
	own  *os.File // the current life's file, locked; nil: none
	path string
}

// lifeRecord is what a life's file says of it: the database it lives in and
// its holder row (id, name, birth), which the end of a dead life must
// match.
type lifeRecord struct {
	Database string    `json:"database"`
	HolderID int64     `json:"holder_id"`
	Name     string    `json:"name"`
	Created  time.Time `json:"created_at"`
	PID      int       `json:"pid"`
}

// lifeSuffix ends every life file's final name; temporary names start
// with a dot.
const lifeSuffix = ".life"

// lifeDirDefault is LifeDir's default: arbor-lives in the system's
// temporary directory.
func lifeDirDefault() string { return filepath.Join(os.TempDir(), "arbor-lives") }

// newLifeLock prepares dir for the lives of database db (its identity and
// arbor's schema). An error says why life locks cannot be used here: the
// runner then waits for leases, as without them.
func newLifeLock(dir, db string) (*lifeLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := localFilesystem(dir); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(db))
	return &lifeLock{dir: dir, db: db, prefix: hex.EncodeToString(sum[:8]) + "-"}, nil
}

// hold makes rec's life the one this lock stands for: its file is created
// and locked, and the previous life's file, if any, unlinked and closed.
func (l *lifeLock) hold(rec lifeRecord) error {
	rec.Database, rec.PID = l.db, os.Getpid()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(l.dir, ".life-*")
	if err != nil {
		return err
	}
	final := filepath.Join(l.dir, fmt.Sprintf("%s%d%s", l.prefix, rec.HolderID, lifeSuffix))
	err = tryLock(f)
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = os.Rename(f.Name(), final)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		_ = f.Close()
		return err
	}
	l.mu.Lock()
	old, oldPath := l.own, l.path
	l.own, l.path = f, final
	l.mu.Unlock()
	if old != nil {
		_ = os.Remove(oldPath) // before the close: nobody locks it by that name after
		_ = old.Close()
	}
	return nil
}

// release ends the lock of the current life: the life's row is gone, and
// nothing of it runs any more.
func (l *lifeLock) release() {
	l.mu.Lock()
	f, path := l.own, l.path
	l.own, l.path = nil, ""
	l.mu.Unlock()
	if f != nil {
		_ = os.Remove(path)
		_ = f.Close()
	}
}

// keep keeps the current life's file locked until the process exits: the
// life may still hold conversations (a stop that left some to lapse, a
// handler that ignored its cancellation), and no other runner may prove it
// dead while this process lives. The file is kept reachable, so that no
// finalizer closes it.
func (l *lifeLock) keep() {
	l.mu.Lock()
	f := l.own
	l.own, l.path = nil, ""
	l.mu.Unlock()
	if f != nil {
		keptLives.Lock()
		keptLives.files = append(keptLives.files, f)
		keptLives.Unlock()
	}
}

var keptLives struct {
	sync.Mutex
	files []*os.File
}

// deadLife is another life of this database on this host, proven dead:
// its file is locked by this process until done.
type deadLife struct {
	rec  lifeRecord
	f    *os.File
	path string
}

// done drops the lock of a dead life's file; remove unlinks it first (its
// row was ended, or was not that life's to end any more).
func (d deadLife) done(remove bool) {
	if remove {
		_ = os.Remove(d.path)
	}
	_ = d.f.Close()
}

// dead lists the lives of this database whose files it could lock: their
// processes have exited. A file it cannot read as a life of this database
// is removed; one whose name another prover unlinked meanwhile is skipped.
func (l *lifeLock) dead() []deadLife {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return nil
	}
	l.mu.Lock()
	own := l.path
	l.mu.Unlock()
	var out []deadLife
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, l.prefix) || !strings.HasSuffix(name, lifeSuffix) {
			continue
		}
		path := filepath.Join(l.dir, name)
		if path == own {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		if err := tryLock(f); err != nil {
			_ = f.Close() // locked: its process lives (or another prover has it)
			continue
		}
		if !sameFile(f, path) {
			_ = f.Close() // unlinked by another prover while this one opened it
			continue
		}
		var rec lifeRecord
		b, err := readAll(f)
		if err != nil {
			_ = f.Close()
			continue
		}
		if err := json.Unmarshal(b, &rec); err != nil || rec.Database != l.db || rec.HolderID <= 0 {
			deadLife{f: f, path: path}.done(true) // not a life of this database: never will be
			continue
		}
		out = append(out, deadLife{rec: rec, f: f, path: path})
	}
	return out
}

// sameFile reports whether path still names the file f has open.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

func readAll(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > 1<<16 {
		return nil, errors.New("too large")
	}
	b := make([]byte, st.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}

// startLife prepares the runner's life locks before its first life: the
// database's identity, and LifeDir. When they cannot be used, the runner
// says why once and waits for leases, as without them.
func (r *Runner) startLife(ctx context.Context) {
	if r.cfg.LifeDir == "-" {
		return
	}
	level := slog.LevelWarn
	if r.cfg.LifeDir == lifeDirDefault() {
		level = slog.LevelInfo // not asked for: the default on a host that cannot have it
	}
	db, err := core.Read(ctx, r.lease.core, func(db store.DB) (string, error) { return r.lease.core.DatabaseIdentity(ctx, db) })
	var life *lifeLock
	if err == nil {
		life, err = newLifeLock(r.cfg.LifeDir, db)
	}
	if err != nil {
		r.logger.Log(ctx, level, "arbor: life locks are off: a process of this host that dies is taken over only when its lease expires (RunnerConfig.LifeDir)",
			slog.String("life_dir", r.cfg.LifeDir), slog.String("error", err.Error()))
		return
	}
	r.life = life
	r.lease.onLife = func(id int64, created time.Time) {
		if err := life.hold(lifeRecord{HolderID: id, Name: r.cfg.NodeID, Created: created}); err != nil {
			r.logger.Warn("arbor: the life's lock file could not be made: if this process dies, its conversations wait for its lease",
				slog.String("life_dir", r.cfg.LifeDir), slog.String("error", err.Error()))
		}
	}
}

// lifeLoop proves other lives of this host dead, at start and every sixth
// of the lease.
func (r *Runner) lifeLoop() {
	if r.life == nil {
		return
	}
	t := time.NewTicker(r.cfg.ConversationLease / 6)
	defer t.Stop()
	for {
		r.proveDeaths(r.runCtx)
		select {
		case <-r.runCtx.Done():
			return
		case <-t.C:
		}
	}
}

// proveDeaths ends the holder rows of the lives of this host whose files it
// could lock (their processes have exited), and asks for an open when it
// ended any: their conversations are free now.
func (r *Runner) proveDeaths(ctx context.Context) {
	if !r.lease.usable(time.Now()) {
		return // the end needs a live row of this node's own
	}
	me, _ := r.lease.holder()
	ended := 0
	for _, d := range r.life.dead() {
		ectx, cancel := context.WithTimeout(ctx, r.cfg.ConversationLease/2)
		ok, err := core.Read(ectx, r.core, func(db store.DB) (bool, error) {
			return r.core.EndDeadHolder(ectx, db, d.rec.HolderID, d.rec.Name, d.rec.Created, me)
		})
		cancel()
		if err != nil {
			d.done(false) // tried again at the next look
			if ctx.Err() == nil {
				r.logger.Debug("arbor: ending a dead life's holder row failed; trying again", slog.String("error", err.Error()))
			}
			continue
		}
		d.done(true)
		if ok {
			ended++
			r.logger.Info("arbor: a runner of this host died; its conversations are taken over at once (its lock file proved the death)",
				slog.String("dead_node", d.rec.Name), slog.Int64("dead_holder_id", d.rec.HolderID), slog.Int("dead_pid", d.rec.PID))
		}
	}
	if ended > 0 {
		p := r.prod
		p.mu.Lock()
		p.wantOpen = true
		p.mu.Unlock()
		p.poke()
	}
}
