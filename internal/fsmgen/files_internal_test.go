package fsmgen

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFilesWritesTheNewestRegion: the current guards go into the newest
// migration that holds their region, and that migration's down file, when
// it holds the region too, gets the text of the migration before it (the
// guard its down restores); older migrations keep the text they had.
func TestFilesWritesTheNewestRegion(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	sql := filepath.Join(root, "migrations", "sql")
	require.NoError(t, os.MkdirAll(sql, 0o755))
	write := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(sql, name), []byte(body), 0o644))
	}
	write("001_base.up.sql", "CREATE TABLE t ();\n"+begin("guard")+"-- the first guard\n"+end("guard")+begin("records")+"-- stale\n"+end("records")+"-- after\n")
	write("001_base.down.sql", "DROP TABLE t;\n")
	write("002_next.up.sql", begin("guard")+"-- stale\n"+end("guard"))
	write("002_next.down.sql", "-- restore\n"+begin("guard")+end("guard"))

	files, err := Files(root)
	require.NoError(t, err)
	require.Len(t, files, 4) // the docs, 001's up (records), 002's up and down (guard)
	require.Equal(t, "CREATE TABLE t ();\n"+begin("guard")+"-- the first guard\n"+end("guard")+begin("records")+RecordGuardSQL()+end("records")+"-- after\n",
		files[filepath.Join(sql, "001_base.up.sql")])
	require.Equal(t, begin("guard")+GuardSQL()+end("guard"), files[filepath.Join(sql, "002_next.up.sql")])
	require.Equal(t, "-- restore\n"+begin("guard")+"-- the first guard\n"+end("guard"), files[filepath.Join(sql, "002_next.down.sql")])

	// A down file that would restore a guard no migration before wrote.
	write("001_base.down.sql", begin("records")+end("records"))
	_, err = Files(root)
	require.ErrorContains(t, err, "no migration before it")

	// No migration holds a region: nothing to write the guards into.
	require.NoError(t, os.Remove(filepath.Join(sql, "002_next.up.sql")))
	write("001_base.up.sql", "CREATE TABLE t ();\n")
	_, err = Files(root)
	require.ErrorContains(t, err, "holds the line")
}
