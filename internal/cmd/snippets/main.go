// Command snippets checks that every Go snippet of the documentation
// compiles against arbor as a user's module sees it (`make lint` runs it
// from the repository's root):
//
//	go run ./internal/cmd/snippets [FILE.md ...]
//
// With no files it reads README.md and docs/*.md. It makes a module outside
// the repository that requires arbor and otelarbor and replaces them with
// this checkout, as the README's "Using arbor in your module" says, tidies
// and builds it (so a module of a user's builds), then type-checks every
// ```go block of the files against it, each as a package of its own: a
// block of declarations as a file, any other as the body of a function
// returning an error. The names a snippet uses without declaring them
// (ctx, engine, run, the application's handlers…) are declared by a
// prelude (prelude.txt), and the packages it uses are imported for it.
// Unused variables and imports are not errors: a snippet shows a step. A
// deliberately partial block is marked, on the line before its fence, with
//
//	<!-- snippet: skip: why -->
//
// Errors name the Markdown file and line; the exit status is 1 when any
// snippet does not compile, 2 when the check cannot run.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("snippets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "the repository's root: the checkout the scratch module replaces arbor with")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	files := fs.Args()
	if len(files) == 0 {
		docs, err := filepath.Glob(filepath.Join(*root, "docs", "*.md"))
		if err != nil {
			fmt.Fprintln(stderr, "snippets:", err)
			return 2
		}
		files = append([]string{filepath.Join(*root, "README.md")}, docs...)
	}
	var all []snippet
	for _, path := range files {
		name := path
		if rel, err := filepath.Rel(*root, path); err == nil && filepath.IsLocal(rel) {
			name = rel
		}
		sns, err := extract(path, name)
		if err != nil {
			fmt.Fprintln(stderr, "snippets:", err)
			return 2
		}
		all = append(all, sns...)
	}
	s, err := newScratch(*root)
	if err != nil {
		fmt.Fprintln(stderr, "snippets:", err)
		return 2
	}
	defer s.remove()
	failed, skipped := 0, 0
	for _, sn := range all {
		if sn.skip != "" {
			skipped++
			continue
		}
		errs := s.check(sn)
		if len(errs) > 0 {
			failed++
			for _, e := range errs {
				fmt.Fprintln(stderr, e)
			}
		}
	}
	fmt.Fprintf(stdout, "snippets: %d Go snippets in %d files, %d compile, %d do not, %d marked partial\n",
		len(all), len(files), len(all)-failed-skipped, failed, skipped)
	if failed > 0 {
		return 1
	}
	return 0
}
