// Command doclinks checks that what the documentation names exists (`make
// lint` runs it from the repository's root):
//
//	go run ./internal/cmd/doclinks [-root DIR]
//
// It reads README.md, docs/*.md and the comments of every Go file (tests
// and examples too), and fails on drift, each problem at the doc's file and
// line:
//
//   - a Go file a doc names (fsm/fsm.go, internal/core/doc.go:42, a
//     pattern such as tasks/example_*_test.go) that is not there, or a line
//     past its end;
//   - a section (§3, §3.12) that docs/design.md — or the doc the reference
//     names just before it, or the doc itself when it numbers its own
//     sections — does not have;
//   - a Go name of arbor's in a Markdown code span or a doc.go's (the
//     form pkg.Name, pkg.Type.Member, Type.Member, or a sentinel ErrX),
//     in a doc.go's doc links ([Engine.Create]), or written qualified in
//     any comment or Markdown line (tasks.Engine.Create, [machine.Run]),
//     that its package does not declare: a name it cannot place (a variable's, another
//     module's package's) passes;
//   - the operation table of design.md §3 against the exported methods
//     of the types its rows name (tasks.Engine, machine.Run,
//     machine.Lease): a method the table lacks, or a name it lists that
//     is no method.
//
// Declarations are read with go/ast, test files included (a doc may name
// an example). The exit status is 1 on drift, 2 when the check cannot run.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("doclinks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "the repository's root")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	problems, docs, err := check(*root)
	if err != nil {
		fmt.Fprintln(stderr, "doclinks:", err)
		return 2
	}
	for _, p := range problems {
		fmt.Fprintln(stderr, p)
	}
	fmt.Fprintf(stdout, "doclinks: %d Markdown docs and the Go comments checked, %d broken references\n", docs, len(problems))
	if len(problems) > 0 {
		return 1
	}
	return 0
}

// check runs every check on the repository at root and returns the
// problems in file and line order, and how many Markdown docs it read.
func check(root string) ([]problem, int, error) {
	ix, err := load(root)
	if err != nil {
		return nil, 0, err
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, 0, err
	}
	md := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			return nil, 0, err
		}
		md = append(md, filepath.ToSlash(rel))
	}
	c := &checker{ix: ix, root: root, sections: map[string]map[string]bool{}}
	for _, doc := range md {
		if err := c.readSections(doc); err != nil {
			return nil, 0, err
		}
	}
	for _, doc := range md {
		if err := c.checkMarkdown(doc); err != nil {
			return nil, 0, err
		}
	}
	c.checkGoComments()
	if err := c.checkOperations("docs/design.md"); err != nil {
		return nil, 0, err
	}
	slices.SortStableFunc(c.problems, func(a, b problem) int {
		if a.file != b.file {
			if a.file < b.file {
				return -1
			}
			return 1
		}
		return a.line - b.line
	})
	return c.problems, len(md), nil
}
