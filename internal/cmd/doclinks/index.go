package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// index is what the repository's Go code declares, by package name (the
// name a doc writes before the dot: tasks, machine, core…), read with
// go/ast alone: a package of a _test file counts as the package it tests,
// so that a doc may name an example or a test helper.
type index struct {
	pkgs  map[string]*pkgIndex
	files map[string]bool // every file of the repository, slash-separated and relative to its root
	bases map[string]bool // their base names
	lines map[string]int  // line counts of the .go files
	// comments are the comments of every .go file, in file order.
	comments []goComment
}

type pkgIndex struct {
	name  string
	decls map[string]bool // every top-level name: types, funcs, vars, consts
	funcs map[string]bool // the package-level functions
	types map[string]*typeInfo
}

type typeInfo struct {
	fields   map[string]bool // fields, and an interface's methods
	methods  map[string]bool // methods declared on it (T or *T)
	embedded []typeRef       // embedded fields, whose members it promotes
	alias    *typeRef        // type T = U (or type T U: the same members' names for a struct)
}

// typeRef names a type: pkg is its package's name ("" for the same package).
type typeRef struct{ pkg, name string }

// goComment is one comment of a Go file, with the file and line it starts at.
type goComment struct {
	file, pkg string // pkg: the package's name
	line      int
	text      string
	docGo     bool // the package's doc.go
}

func (ix *index) pkg(name string) *pkgIndex {
	p := ix.pkgs[name]
	if p == nil {
		p = &pkgIndex{name: name, decls: map[string]bool{}, funcs: map[string]bool{}, types: map[string]*typeInfo{}}
		ix.pkgs[name] = p
	}
	return p
}

func (p *pkgIndex) typ(name string) *typeInfo {
	t := p.types[name]
	if t == nil {
		t = &typeInfo{fields: map[string]bool{}, methods: map[string]bool{}}
		p.types[name] = t
	}
	return t
}

// skipDir are the folders of the repository that hold no code a doc names.
func skipDir(rel string) bool {
	base := path.Base(rel)
	return rel != "." && (strings.HasPrefix(base, ".") || base == "testdata" || base == "node_modules")
}

// load reads every file name of the repository at root and every Go file's
// declarations and comments.
func load(root string) (*index, error) {
	ix := &index{pkgs: map[string]*pkgIndex{}, files: map[string]bool{}, bases: map[string]bool{}, lines: map[string]int{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skipDir(rel) {
				return filepath.SkipDir
			}
			if rel != "." {
				ix.files[rel] = true
			}
			return nil
		}
		ix.files[rel] = true
		ix.bases[path.Base(rel)] = true
		if !strings.HasSuffix(rel, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		ix.lines[rel] = strings.Count(string(src), "\n") + 1
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ix.add(f)
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				ix.comments = append(ix.comments, goComment{file: rel, pkg: strings.TrimSuffix(f.Name.Name, "_test"),
					line: fset.Position(c.Pos()).Line, text: c.Text, docGo: path.Base(rel) == "doc.go"})
			}
		}
		return nil
	})
	return ix, err
}

// add records a file's declarations.
func (ix *index) add(f *ast.File) {
	p := ix.pkg(strings.TrimSuffix(f.Name.Name, "_test"))
	imports := map[string]string{} // the name a file uses for an import → the package's name
	for _, im := range f.Imports {
		ip, _ := strconv.Unquote(im.Path.Value)
		name := path.Base(ip)
		if len(name) > 1 && name[0] == 'v' && strings.Trim(name[1:], "0123456789") == "" {
			name = path.Base(path.Dir(ip)) // …/pgx/v5 is pgx
		}
		local := name
		if im.Name != nil {
			local = im.Name.Name
		}
		imports[local] = name
	}
	ref := func(e ast.Expr) *typeRef {
		for {
			switch x := e.(type) {
			case *ast.StarExpr:
				e = x.X
				continue
			case *ast.IndexExpr:
				e = x.X
				continue
			case *ast.IndexListExpr:
				e = x.X
				continue
			case *ast.Ident:
				return &typeRef{name: x.Name}
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok {
					return &typeRef{pkg: imports[id.Name], name: x.Sel.Name}
				}
			}
			return nil
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				p.decls[d.Name.Name] = true
				p.funcs[d.Name.Name] = true
				continue
			}
			if r := ref(d.Recv.List[0].Type); r != nil {
				p.typ(r.name).methods[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.decls[n.Name] = true
					}
				case *ast.TypeSpec:
					p.decls[s.Name.Name] = true
					t := p.typ(s.Name.Name)
					switch x := s.Type.(type) {
					case *ast.StructType:
						for _, fl := range x.Fields.List {
							if len(fl.Names) == 0 {
								if r := ref(fl.Type); r != nil {
									t.embedded = append(t.embedded, *r)
									t.fields[r.name] = true
								}
							}
							for _, n := range fl.Names {
								t.fields[n.Name] = true
							}
						}
					case *ast.InterfaceType:
						for _, m := range x.Methods.List {
							for _, n := range m.Names {
								t.fields[n.Name] = true
							}
							if len(m.Names) == 0 {
								if r := ref(m.Type); r != nil {
									t.embedded = append(t.embedded, *r)
								}
							}
						}
					default:
						// type T = U, or type T U: the names of U's fields
						// (a defined type keeps a struct's fields, not its
						// methods; close enough for naming).
						t.alias = ref(s.Type)
					}
				}
			}
		}
	}
}

// lookupType returns the type named name of package pkg, following aliases.
func (ix *index) lookupType(pkg, name string) (*pkgIndex, *typeInfo) {
	p := ix.pkgs[pkg]
	if p == nil {
		return nil, nil
	}
	return p, p.types[name]
}

// hasMember reports whether type name of package pkg has a field or method
// called member, itself, through an alias or through an embedded field.
func (ix *index) hasMember(pkg, name, member string) bool {
	return ix.member(pkg, name, member, 0)
}

func (ix *index) member(pkg, name, member string, depth int) bool {
	p, t := ix.lookupType(pkg, name)
	if t == nil || depth > 8 {
		return false
	}
	if t.fields[member] || t.methods[member] {
		return true
	}
	next := t.embedded
	if t.alias != nil {
		next = append([]typeRef{*t.alias}, next...)
	}
	for _, r := range next {
		rp := r.pkg
		if rp == "" {
			rp = p.name
		}
		if ix.member(rp, r.name, member, depth+1) {
			return true
		}
	}
	return false
}

// methodSet returns the exported methods of type name of package pkg,
// its own and those its embedded fields promote.
func (ix *index) methodSet(pkg, name string) map[string]bool {
	out := map[string]bool{}
	var walk func(pkg, name string, depth int)
	walk = func(pkg, name string, depth int) {
		p, t := ix.lookupType(pkg, name)
		if t == nil || depth > 8 {
			return
		}
		for m := range t.methods {
			if ast.IsExported(m) {
				out[m] = true
			}
		}
		for _, r := range t.embedded {
			rp := r.pkg
			if rp == "" {
				rp = p.name
			}
			walk(rp, r.name, depth+1)
		}
	}
	walk(pkg, name, 0)
	return out
}
