package main

import (
	"fmt"
	"go/ast"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// problem is one broken reference, at the doc's file and line.
type problem struct {
	file string
	line int
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.msg) }

// checker checks the references of docs against an index.
type checker struct {
	ix       *index
	root     string
	sections map[string]map[string]bool // doc (slash path) → its numbered sections
	problems []problem
}

func (c *checker) fail(file string, line int, format string, args ...any) {
	c.problems = append(c.problems, problem{file, line, fmt.Sprintf(format, args...)})
}

var (
	// A path to a Go file, with a line or a line range: fsm/fsm.go,
	// internal/core/doc.go:42, tasks/example_*_test.go.
	goPath = regexp.MustCompile(`[\w./*-]*\.go(?::\d+(?:-\d+)?)?`)
	// A section reference, §3 or §3.12.
	sectionRef = regexp.MustCompile(`§(\d+(?:\.\d+)*)`)
	// The doc a section reference names just before it: "design.md §3".
	docBefore = regexp.MustCompile(`([\w-]+\.md)\s*$`)
	// A numbered heading: "## 3. Operations", "### 3.12 Events".
	numbered = regexp.MustCompile(`^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s`)
	// A backquoted span of Markdown.
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// A dotted Go name: pkg.Name, Type.Member, pkg.Type.Member, with an
	// optional () of a call.
	dotted = regexp.MustCompile(`^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?(?:\(\))?$`)
	// A sentinel error named bare: ErrNotFound.
	sentinel = regexp.MustCompile(`^Err[A-Z]\w*$`)
	// In a Go comment, a qualified name not quoted: tasks.Engine.Create.
	qualified = regexp.MustCompile(`([a-z]\w*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	// A Go doc link: [Name], [Type.Method], [pkg.Name].
	docLink = regexp.MustCompile(`\[([A-Za-z]\w*(?:\.[A-Za-z]\w*){0,2})\]`)
)

// checkPaths checks every Go file a line names. dir is the folder of the
// doc (slash-separated, relative to the root).
func (c *checker) checkPaths(file string, line int, dir, text string) {
	for _, m := range goPath.FindAllStringIndex(text, -1) {
		ref := text[m[0]:m[1]]
		before, after := "", ""
		if m[0] > 0 {
			before = text[:m[0]]
		}
		after = text[m[1]:]
		switch {
		case strings.HasPrefix(ref, "//") || strings.HasSuffix(before, ":") || strings.HasSuffix(before, "/") ||
			strings.HasPrefix(ref, ".go") || strings.HasPrefix(ref, "*.go"):
			continue // a URL (pkg.go.dev), or a kind of file rather than one
		case after != "" && (after[0] == '.' && len(after) > 1 && isWord(after[1]) || isWord(after[0])):
			continue // go.dev, gopher: not a file name
		}
		name, lines := ref, ""
		if i := strings.Index(ref, ".go:"); i >= 0 {
			name, lines = ref[:i+3], ref[i+4:]
		}
		name = strings.TrimPrefix(name, "./")
		resolved, ok := c.resolve(dir, name)
		if !ok {
			c.fail(file, line, "%s names %s, which is no file of the repository", ref, name)
			continue
		}
		if lines == "" || resolved == "" {
			continue
		}
		for _, n := range strings.Split(lines, "-") {
			if v, _ := strconv.Atoi(n); v < 1 || v > c.ix.lines[resolved] {
				c.fail(file, line, "%s: %s has %d lines", ref, resolved, c.ix.lines[resolved])
				break
			}
		}
	}
}

func isWord(b byte) bool {
	return b == '_' || '0' <= b && b <= '9' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z'
}

// resolve finds a Go file a doc in dir names: from the root, from the
// doc's folder, or — a base name alone, as "completer.go" after
// "machine/producer.go" — anywhere. A pattern (tasks/example_*_test.go) must
// match a file. It returns the file when it is one file.
func (c *checker) resolve(dir, name string) (string, bool) {
	for _, cand := range []string{name, path.Join(dir, name)} {
		if strings.Contains(cand, "*") {
			matches, _ := filepath.Glob(filepath.Join(c.root, filepath.FromSlash(cand)))
			if len(matches) > 0 {
				return "", true
			}
			continue
		}
		if c.ix.files[cand] {
			return cand, true
		}
	}
	if !strings.Contains(name, "/") && !strings.Contains(name, "*") && c.ix.bases[name] {
		return "", true
	}
	return "", false
}

// checkSections checks every § reference of a line: to the doc named just
// before it, else to the doc itself when it numbers its sections, else to
// docs/design.md.
func (c *checker) checkSections(file string, line int, text string) {
	for _, m := range sectionRef.FindAllStringSubmatchIndex(text, -1) {
		num := text[m[2]:m[3]]
		target := "docs/design.md"
		if d := docBefore.FindStringSubmatch(text[:m[0]]); d != nil {
			target = c.docNamed(d[1])
		} else if len(c.sections[file]) > 0 {
			target = file
		}
		secs, ok := c.sections[target]
		if !ok {
			c.fail(file, line, "§%s refers to %s, which is no doc of the repository", num, target)
			continue
		}
		if !secs[num] {
			c.fail(file, line, "§%s: %s has no section %s", num, target, num)
		}
	}
}

// docNamed finds the Markdown doc a reference names by its base name
// (design.md, DESIGN.md: docs/design.md).
func (c *checker) docNamed(base string) string {
	for doc := range c.sections {
		if strings.EqualFold(path.Base(doc), base) {
			return doc
		}
	}
	return base
}

// readSections records the numbered sections of a Markdown doc.
func (c *checker) readSections(doc string) error {
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(doc)))
	if err != nil {
		return err
	}
	secs := map[string]bool{}
	for _, l := range markdownLines(string(src)) {
		if m := numbered.FindStringSubmatch(l.text); m != nil {
			secs[m[1]] = true
		}
	}
	c.sections[doc] = secs
	return nil
}

type mdLine struct {
	n    int
	text string
	code bool // inside a fenced block
}

func markdownLines(src string) []mdLine {
	var out []mdLine
	fenced := false
	for i, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		out = append(out, mdLine{i + 1, l, fenced})
	}
	return out
}

// checkName checks one Go name a doc writes: pkg.Name[.Member],
// Type.Member or a bare sentinel ErrX. Names it cannot place — a
// variable (engine.Create), another module's package (pgx.Tx) — pass:
// the check is for arbor's own names. It reports what is wrong, or "".
func (c *checker) checkName(name, here string) string {
	name = strings.TrimSuffix(name, "()")
	if sentinel.MatchString(name) {
		for _, p := range c.ix.pkgs {
			if p.decls[name] {
				return ""
			}
		}
		return fmt.Sprintf("%s is declared in no package", name)
	}
	m := dotted.FindStringSubmatch(name)
	if m == nil {
		return ""
	}
	first, second, third := m[1], m[2], m[3]
	if p, ok := c.ix.pkgs[first]; ok && first != "main" {
		if !p.decls[second] {
			return fmt.Sprintf("package %s has no %s", first, second)
		}
		if third != "" && !c.ix.hasMember(first, second, third) {
			return fmt.Sprintf("%s.%s has no field or method %s", first, second, third)
		}
		return ""
	}
	if !ast.IsExported(first) || third != "" || strings.ToUpper(first) == first {
		return "" // a variable's field or method (engine.Create, run.Task.Delivered), or SQL's NEW.status
	}
	// Type.Member: a type of that name in some package of arbor's (the
	// doc's own package first) must have the member.
	found := false
	for _, pkg := range c.pkgOrder(here) {
		if _, t := c.ix.lookupType(pkg, first); t != nil {
			found = true
			if c.ix.hasMember(pkg, first, second) {
				return ""
			}
		}
	}
	if !found {
		return fmt.Sprintf("%s is a type of no package", first)
	}
	return fmt.Sprintf("%s has no field or method %s", first, second)
}

// pkgOrder is every package's name, here first.
func (c *checker) pkgOrder(here string) []string {
	out := []string{}
	if here != "" {
		out = append(out, here)
	}
	for name := range c.ix.pkgs {
		if name != here {
			out = append(out, name)
		}
	}
	return out
}

// checkMarkdown checks a Markdown doc: the Go files and sections every
// line names, and the Go names of its code spans (fenced blocks are Go
// the snippets check compiles).
func (c *checker) checkMarkdown(doc string) error {
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(doc)))
	if err != nil {
		return err
	}
	dir := path.Dir(doc)
	for _, l := range markdownLines(string(src)) {
		if l.code {
			continue
		}
		c.checkPaths(doc, l.n, dir, l.text)
		c.checkSections(doc, l.n, l.text)
		for _, m := range codeSpan.FindAllStringSubmatch(l.text, -1) {
			if msg := c.checkName(m[1], ""); msg != "" {
				c.fail(doc, l.n, "`%s`: %s", m[1], msg)
			}
		}
		// Outside code spans, a name qualified by one of arbor's
		// packages (a link's text: [tasks.Engine](…)).
		prose := codeSpan.ReplaceAllString(l.text, "``")
		for _, m := range qualified.FindAllStringSubmatchIndex(prose, -1) {
			if m[0] > 0 && (prose[m[0]-1] == '.' || isWord(prose[m[0]-1]) || prose[m[0]-1] == '/') {
				continue
			}
			if first := prose[m[2]:m[3]]; c.ix.pkgs[first] == nil || first == "main" {
				continue
			}
			name := prose[m[0]:m[1]]
			if msg := c.checkName(name, ""); msg != "" {
				c.fail(doc, l.n, "%s: %s", name, msg)
			}
		}
	}
	return nil
}

// checkGoComments checks the comments of the Go files: in every file the
// Go files and sections they name and the qualified names of arbor's
// packages (tasks.Engine.Create, [machine.Run]) and, in a package's doc.go,
// also its code spans and its doc links to its own names ([Engine.Create]).
func (c *checker) checkGoComments() {
	defined := map[string]map[string]bool{} // file → the [text] of its link definitions
	for _, gc := range c.ix.comments {
		for _, m := range regexp.MustCompile(`(?m)^//\s*\[([^\]]+)\]:`).FindAllStringSubmatch(gc.text, -1) {
			if defined[gc.file] == nil {
				defined[gc.file] = map[string]bool{}
			}
			defined[gc.file][m[1]] = true
		}
	}
	for _, gc := range c.ix.comments {
		if strings.HasPrefix(gc.text, "//go:") {
			continue
		}
		dir := path.Dir(gc.file)
		for i, text := range strings.Split(gc.text, "\n") {
			line := gc.line + i
			for _, m := range qualified.FindAllStringSubmatchIndex(text, -1) {
				if m[0] > 0 && (text[m[0]-1] == '.' || isWord(text[m[0]-1]) || text[m[0]-1] == '/' || text[m[0]-1] == '[') {
					continue // r.core.Cfg, github.com/…/tasks.X, or a doc link: below
				}
				name := text[m[0]:m[1]]
				first := text[m[2]:m[3]]
				if _, ok := c.ix.pkgs[first]; !ok {
					continue
				}
				if msg := c.checkName(name, gc.pkg); msg != "" {
					c.fail(gc.file, line, "%s: %s", name, msg)
				}
			}
			for _, m := range docLink.FindAllStringSubmatchIndex(text, -1) {
				name := text[m[2]:m[3]]
				if defined[gc.file][name] || (m[1] < len(text) && text[m[1]] == ':') {
					continue
				}
				// Outside doc.go, brackets are often code ([i], [T]):
				// only a link to another package's name is checked.
				if first, _, _ := strings.Cut(name, "."); !gc.docGo && (first == gc.pkg || c.ix.pkgs[first] == nil || !strings.Contains(name, ".")) {
					continue
				}
				if msg := c.checkDocLink(name, gc.pkg); msg != "" {
					c.fail(gc.file, line, "[%s]: %s", name, msg)
				}
			}
			c.checkPaths(gc.file, line, dir, text)
			c.checkSections(gc.file, line, text)
			if !gc.docGo {
				continue
			}
			for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
				if msg := c.checkName(m[1], gc.pkg); msg != "" {
					c.fail(gc.file, line, "`%s`: %s", m[1], msg)
				}
			}
		}
	}
}

// checkDocLink checks a Go doc link of package here: [Name] and
// [Type.Member] are here's, [pkg.Name] another package's.
func (c *checker) checkDocLink(name, here string) string {
	parts := strings.Split(name, ".")
	if _, ok := c.ix.pkgs[parts[0]]; ok && len(parts) > 1 && parts[0] != here {
		return c.checkName(name, here)
	}
	p := c.ix.pkgs[here]
	switch {
	case len(parts) == 1 && !p.decls[parts[0]]:
		return fmt.Sprintf("package %s has no %s", here, parts[0])
	case len(parts) == 2 && !c.ix.hasMember(here, parts[0], parts[1]):
		return fmt.Sprintf("%s.%s has no field or method %s", here, parts[0], parts[1])
	}
	return ""
}
