package guardhistory_test

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/guardhistory"
)

func fsOf(files map[string]string) fstest.MapFS {
	m := fstest.MapFS{}
	for name, content := range files {
		m["guard/"+name] = &fstest.MapFile{Data: []byte(content)}
	}
	return m
}

// TestFilesThenLoadGivesEveryVersion: the newest kept whole, the older ones
// as patches, and every version read back exactly.
func TestFilesThenLoadGivesEveryVersion(t *testing.T) {
	t.Parallel()
	texts := map[int]string{
		5:  "create a;\ncheck x;\n",
		8:  "create a;\ncheck x;\ncheck y;\n",
		11: "create a;\ncheck y;\ncheck z;\n",
	}
	files, err := guardhistory.Files(texts)
	require.NoError(t, err)
	require.Equal(t, texts[11], files["011.sql"])
	require.Contains(t, files, "005.patch")
	require.Contains(t, files, "008.patch")
	require.Len(t, files, 3)
	got, err := guardhistory.Load(fsOf(files), "guard")
	require.NoError(t, err)
	require.Equal(t, texts, got)

	histories := map[string]map[int]string{"guard": got, "records": {3: "create r;\n"}}
	sql, err := guardhistory.Expand("BEGIN;\n-- arbor:guard 008\n-- arbor:records 003\nCOMMIT;\n", histories)
	require.NoError(t, err)
	require.Equal(t, "BEGIN;\n"+texts[8]+"create r;\nCOMMIT;\n", sql)
	_, err = guardhistory.Expand("-- arbor:guard 009\n", histories)
	require.ErrorContains(t, err, "no such version: -- arbor:guard 009")
	_, err = guardhistory.Expand("-- arbor:records 008\n", histories)
	require.ErrorContains(t, err, "no such version: -- arbor:records 008")
	// A directive written otherwise would stay a comment and apply
	// nothing: it is refused.
	for _, bad := range []string{"-- arbor:guard 008", "-- arbor:guard 008 \n", "-- arbor:guard 008\r\n", "-- arbor:guard 08\n", " --arbor:guard 008\n", "BEGIN;\n-- arbor:gaurd 008\n"} {
		_, err := guardhistory.Expand(bad, histories)
		require.ErrorContains(t, err, "is not a directive as written", "%q", bad)
	}
}

// TestLoadRefusesABrokenHistory: a history that cannot give each version
// exactly is an error, never a guess.
func TestLoadRefusesABrokenHistory(t *testing.T) {
	t.Parallel()
	files, err := guardhistory.Files(map[int]string{5: "a\nb\n", 8: "a\nc\n"})
	require.NoError(t, err)
	for name, broken := range map[string]map[string]string{
		"two whole guards":   {"005.sql": "a\nb\n", "008.sql": "a\nc\n"},
		"no whole guard":     {"005.patch": files["005.patch"]},
		"a patch newer":      {"005.sql": "a\nb\n", "008.patch": files["005.patch"]},
		"a foreign file":     {"008.sql": "a\nc\n", "notes.txt": "x\n"},
		"the newest changed": {"008.sql": "a\nC\n", "005.patch": files["005.patch"]},
	} {
		_, err := guardhistory.Load(fsOf(broken), "guard")
		require.Error(t, err, name)
	}
}
