package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeTree writes files (slash path → content) under a temporary root.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return root
}

// A repository in small: a package tasks with an Engine, a package
// machine with a Run that embeds a type of tasks', and docs that name
// them rightly and wrongly.
var fixture = map[string]string{
	"tasks/engine.go": `package tasks

// Engine is the engine.
type Engine struct{ cfg Config }

// Config configures it.
type Config struct{ Retention int }

// ErrNotFound is a sentinel.
var ErrNotFound error

func New() *Engine { return nil }

func (e *Engine) Create()   {}
func (e *Engine) CreateTx() {}
func (e *Engine) Get()      {}
func (e *Engine) internal() {}
`,
	"tasks/doc.go": `// Package tasks: see [Engine.Create], [Engine.Gone] and [Config]; the
// runner is [machine.Run] ([machine.Nope] is not). Its order is argued in
// tasks/engine.go:3 and in tasks/engine.go:99 (past the end), and in
// docs/design.md §3 and §9.
//
// [River]: https://riverqueue.com
// [River] is a link, https://pkg.go.dev/x.go is a URL.
package tasks
`,
	"machine/run.go": `package machine

import "example.com/x/tasks"

// Run embeds a Config, whose fields it promotes.
type Run struct {
	tasks.Config
}

func (r *Run) Complete() {}
func (r *Run) Spawn()    {}

// Helper comments name tasks.Engine.Create, and tasks.Engine.Gone, which
// is not; r.tasks.Nope is a variable's; tasks/gone.go is no file.
func AcquireLease() {}
`,
	"README.md": "# Readme\n\n" +
		"See `tasks.Engine`, `tasks.Config.Retention`, `machine.Run.Retention` (promoted),\n" + // line 3
		"`Engine.Create`, `ErrNotFound`, `engine.Whatever` (a variable) and `pgx.Tx`.\n" + // line 4
		"Wrong: `tasks.Gone`, `tasks.Config.Gone`, `Engine.Gone`, `ErrGone`, `Nowhere.X`.\n" + // line 5
		"Files: tasks/engine.go, [the run](machine/run.go), machine/gone.go, tasks/*.go, tasks/*_nope.go.\n" + // line 6
		"Sections: design.md §3, docs/design.md §3.1, §1 (design.md's), design.md §3.9.\n" + // line 7
		"```go\n" +
		"tasks.Gone() // in a fenced block: the snippets check's\n" +
		"```\n" +
		"Prose names [tasks.Engine](x), tasks.Config.Retention and tasks.Engine.Gone.\n", // line 11
	"docs/design.md": "# Design\n\n## 1. Words\n\nSee §2, and §1.\n\n" + // line 5: §2 missing
		"## 3. Operations\n\n" +
		"| who calls | operations |\n" + // line 9
		"|---|---|\n" +
		"| you (`tasks.Engine`) | Create, Fork, and the …Tx forms |\n" + // line 11: Fork is none, Get missing
		"| a handler (`machine.Run`) | Complete, Spawn, AcquireLease; returning fails |\n" +
		"| the runner (internal) | claims |\n" +
		"\n### 3.1 Create\n",
}

func TestCheck(t *testing.T) {
	t.Parallel()
	root := writeTree(t, fixture)
	problems, docs, err := check(root)
	require.NoError(t, err)
	require.Equal(t, 2, docs)
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	require.Equal(t, []string{
		"README.md:5: `tasks.Gone`: package tasks has no Gone",
		"README.md:5: `tasks.Config.Gone`: tasks.Config has no field or method Gone",
		"README.md:5: `Engine.Gone`: Engine has no field or method Gone",
		"README.md:5: `ErrGone`: ErrGone is declared in no package",
		"README.md:5: `Nowhere.X`: Nowhere is a type of no package",
		"README.md:6: machine/gone.go names machine/gone.go, which is no file of the repository",
		"README.md:6: tasks/*_nope.go names tasks/*_nope.go, which is no file of the repository",
		"README.md:7: §3.9: docs/design.md has no section 3.9",
		"README.md:11: tasks.Engine.Gone: tasks.Engine has no field or method Gone",
		"docs/design.md:5: §2: docs/design.md has no section 2",
		"docs/design.md:11: the operation table lists Fork for tasks.Engine, which has no such method (nor is it a function of tasks)",
		"docs/design.md:11: tasks.Engine.Get is not in the operation table (line 9): list it in a row of tasks.Engine",
		"machine/run.go:13: tasks.Engine.Gone: tasks.Engine has no field or method Gone",
		"machine/run.go:14: tasks/gone.go names tasks/gone.go, which is no file of the repository",
		"tasks/doc.go:1: [Engine.Gone]: tasks.Engine has no field or method Gone",
		"tasks/doc.go:2: [machine.Nope]: package machine has no Nope",
		"tasks/doc.go:3: tasks/engine.go:99: tasks/engine.go has 18 lines",
		"tasks/doc.go:4: §9: docs/design.md has no section 9",
	}, got)
}

// The repository itself has no broken reference: make lint runs the same.
func TestRepository(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run([]string{"-root", "../../.."}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.True(t, strings.HasPrefix(stdout.String(), "doclinks: "), stdout.String())
}

func TestNoTable(t *testing.T) {
	t.Parallel()
	root := writeTree(t, map[string]string{"README.md": "# r\n", "docs/design.md": "# d\n\n## 3. Operations\n\nNone.\n"})
	problems, _, err := check(root)
	require.NoError(t, err)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0].String(), `docs/design.md:1: §3 has no "who calls | operations" table`)
}
