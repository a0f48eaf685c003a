package main

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// prelude declares the names snippets use undeclared (see prelude.txt).
//
//go:embed prelude.txt
var prelude string

// imports are the packages a snippet uses without importing them, by the
// name it uses them by. Only these are imported for it, and only those it
// uses.
var imports = map[string]string{
	"context":    "context",
	"errors":     "errors",
	"fmt":        "fmt",
	"http":       "net/http",
	"io":         "io",
	"json":       "encoding/json",
	"log":        "log",
	"os":         "os",
	"slog":       "log/slog",
	"strings":    "strings",
	"sync":       "sync",
	"testing":    "testing",
	"time":       "time",
	"pgx":        "github.com/jackc/pgx/v5",
	"pgxpool":    "github.com/jackc/pgx/v5/pgxpool",
	"require":    "github.com/stretchr/testify/require",
	"arbortest":  arborModule + "/arbortest",
	"arbortype":  arborModule + "/arbortype",
	"arborui":    arborModule + "/arborui",
	"arborhttp":  arborModule + "/arborhttp",
	"machine":    arborModule + "/machine",
	"migrations": arborModule + "/migrations",
	"reconcile":  arborModule + "/reconcile",
	"tasks":      arborModule + "/tasks",
	"otelarbor":  otelModule,
	"metric":     "go.opentelemetry.io/otel/metric",
	"trace":      "go.opentelemetry.io/otel/trace",
}

const (
	arborModule = "github.com/arborhq/arbor"
	otelModule  = arborModule + "/otelarbor"
)

// scratch is a module outside the repository that uses arbor and otelarbor
// the way the README tells a user to: a require and a replace of each,
// then go mod tidy.
type scratch struct {
	dir string
	// exports maps an import path to its export data, for the type checker.
	exports map[string]string
}

// newScratch makes the module in a temporary directory, builds it (what
// fails here fails for every user), and lists the export data of every
// package a snippet may import.
func newScratch(root string) (*scratch, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "arbor-snippets-")
	if err != nil {
		return nil, err
	}
	s := &scratch{dir: dir, exports: map[string]string{}}
	var deps strings.Builder
	deps.WriteString("// Every package a snippet may import, so that the module requires it.\npackage main\n\nimport (\n")
	paths := make([]string, 0, len(imports))
	for _, p := range imports {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		fmt.Fprintf(&deps, "\t_ %q\n", p)
	}
	deps.WriteString(")\n\nfunc main() {}\n")
	if err := os.WriteFile(filepath.Join(dir, "deps.go"), []byte(deps.String()), 0o644); err != nil {
		s.remove()
		return nil, err
	}
	steps := [][]string{
		{"mod", "init", "arbor-snippets"},
		// The README's commands ("Using arbor in your module").
		{"mod", "edit", "-require=" + arborModule + "@v0.0.0", "-replace=" + arborModule + "=" + root},
		{"mod", "edit", "-require=" + otelModule + "@v0.0.0", "-replace=" + otelModule + "=" + filepath.Join(root, "otelarbor")},
		{"mod", "tidy"},
		{"build", "./..."},
	}
	for _, args := range steps {
		if _, err := s.goCmd(args...); err != nil {
			s.remove()
			return nil, fmt.Errorf("a module outside the repository that uses arbor and otelarbor as the README says: %w", err)
		}
	}
	out, err := s.goCmd("list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", ".")
	if err != nil {
		s.remove()
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if path, file, ok := strings.Cut(line, "\t"); ok && file != "" {
			s.exports[path] = file
		}
	}
	return s, nil
}

func (s *scratch) remove() { _ = os.RemoveAll(s.dir) }

// goCmd runs the go command in the scratch module, outside any workspace.
func (s *scratch) goCmd(args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// check type-checks one snippet, as a package of its own with the
// prelude, and returns its errors, positioned in the Markdown file.
// Unused variables and imports are not errors here: a snippet shows a
// step, not a program.
func (s *scratch) check(sn snippet) []string {
	fset := token.NewFileSet()
	file, err := wrap(fset, sn)
	if err != nil {
		return []string{err.Error()}
	}
	pre, err := parser.ParseFile(fset, "prelude.txt", prelude, 0)
	if err != nil {
		return []string{fmt.Sprintf("the prelude: %v", err)}
	}
	omit(pre, declared(file))
	var errs []string
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			f, ok := s.exports[path]
			if !ok {
				return nil, fmt.Errorf("%s is not a package snippets may import (see imports in internal/cmd/snippets)", path)
			}
			return os.Open(f)
		}),
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) {
				if te.Soft && (strings.Contains(te.Msg, "declared and not used") || strings.Contains(te.Msg, "imported and not used")) {
					return
				}
				errs = append(errs, fmt.Sprintf("%s: %s", fset.Position(te.Pos), te.Msg))
				return
			}
			errs = append(errs, err.Error())
		},
	}
	_, _ = conf.Check("snippets", fset, []*ast.File{pre, file}, nil)
	return errs
}

// wrap makes sn a Go file: as it is, when it is a file's declarations (a
// function, a test), or else as the body of a function returning an error,
// its statements in order; with the imports of the packages it uses. A
//
//	//line FILE:LINE:1
//
// directive makes every position in it the Markdown file's.
func wrap(fset *token.FileSet, sn snippet) (*ast.File, error) {
	at := fmt.Sprintf("//line %s:%d:1\n", sn.file, sn.line)
	src := "package snippets\n\n" + at + sn.code
	f, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
	if err != nil {
		body := "package snippets\n\nfunc _() error {\n" + at + sn.code + "\nreturn nil\n}\n"
		bf, berr := parser.ParseFile(token.NewFileSet(), "", body, 0)
		if berr != nil {
			if !declarations(sn.code) {
				err = berr
			}
			return nil, fmt.Errorf("%w (mark a deliberately partial snippet with %s: why -->)", parseError(err, sn), skipMarker)
		}
		src, f = body, bf
	}
	own := map[string]bool{}
	for _, im := range f.Imports {
		path := strings.Trim(im.Path.Value, `"`)
		name := path[strings.LastIndex(path, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		own[name] = true
	}
	var need []string
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil && !own[id.Name] && !slices.Contains(need, id.Name) {
				if _, known := imports[id.Name]; known {
					need = append(need, id.Name)
				}
			}
		}
		return true
	})
	slices.Sort(need)
	var decl strings.Builder
	if len(need) > 0 {
		decl.WriteString("import (\n")
		for _, name := range need {
			fmt.Fprintf(&decl, "\t%s %q\n", name, imports[name])
		}
		decl.WriteString(")\n\n")
	}
	src = strings.Replace(src, "package snippets\n\n", "package snippets\n\n"+decl.String(), 1)
	return parser.ParseFile(fset, "snippet.go", src, 0)
}

// declarations reports whether code begins (after comments) as a file's
// declarations do.
func declarations(code string) bool {
	for _, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		for _, kw := range []string{"func ", "type ", "import ", "package ", "var (", "const ("} {
			if strings.HasPrefix(line, kw) {
				return true
			}
		}
		return false
	}
	return false
}

// parseError is a parse error positioned in the Markdown file.
func parseError(err error, sn snippet) error {
	return fmt.Errorf("%s:%d: the snippet does not parse as Go: %v", sn.file, sn.line, err)
}

// declared returns the names f declares at its top level.
func declared(f *ast.File) map[string]bool {
	names := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				names[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					names[sp.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names
}

// omit removes from the prelude the declarations of names.
func omit(pre *ast.File, names map[string]bool) {
	for _, d := range pre.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok == token.IMPORT {
			continue
		}
		var keep []ast.Spec
		for _, sp := range g.Specs {
			switch sp := sp.(type) {
			case *ast.TypeSpec:
				if !names[sp.Name.Name] {
					keep = append(keep, sp)
				}
			case *ast.ValueSpec:
				var ids []*ast.Ident
				for _, n := range sp.Names {
					if !names[n.Name] {
						ids = append(ids, n)
					}
				}
				if len(ids) > 0 {
					sp.Names = ids
					keep = append(keep, sp)
				}
			}
		}
		g.Specs = keep
	}
}
