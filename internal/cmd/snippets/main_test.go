package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The check reports every snippet that does not compile at its Markdown
// line and column, wraps statements and declarations alike, declares the
// prelude's names and imports the packages used, lets unused variables
// pass, and leaves a block marked partial out.
func TestSnippets(t *testing.T) {
	t.Parallel()
	md := filepath.Join(t.TempDir(), "page.md")
	require.NoError(t, os.WriteFile(md, []byte("# A page\n"+
		"\n"+
		"```go\n"+ // statements, using the prelude's engine and ctx: line 4
		"turn, created, err := engine.Create(ctx, arbortype.CreateParams{Kind: 3})\n"+
		"engine.Nope()\n"+
		"```\n"+
		"\n"+
		"<!-- snippet: skip: a fragment of a map -->\n"+
		"```go\n"+
		"\"k\": v,\n"+
		"```\n"+
		"\n"+
		"```go\n"+ // declarations: a test, an unused variable
		"func TestX(t *testing.T) {\n"+
		"\tunused := json.RawMessage(`1`)\n"+
		"\trequire.NoError(t, nil)\n"+
		"}\n"+
		"```\n"+
		"\n"+
		"```go\n"+ // the prelude's turn, declared here instead
		"func turn(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, nil) }\n"+
		"```\n"+
		"\n"+
		"```go\n"+ // not Go: line 25
		"if err != nil { … }\n"+
		"```\n"), 0o644))

	var stdout, stderr bytes.Buffer
	code := run([]string{"-root", "../../..", md}, &stdout, &stderr)
	require.Equal(t, 1, code, "stderr: %s", stderr.String())
	require.Contains(t, stdout.String(), "5 Go snippets in 1 files, 2 compile, 2 do not, 1 marked partial")
	errs := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.Len(t, errs, 3, "%s", stderr.String())
	require.Contains(t, errs[0], md+":4:71: cannot use 3")
	require.Contains(t, errs[1], md+":5:8: engine.Nope undefined")
	require.Contains(t, errs[2], md+":25: the snippet does not parse as Go")
	require.Contains(t, errs[2], skipMarker)
}
