package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

var (
	// The type a row of the operation table is about: (`tasks.Engine`).
	rowType = regexp.MustCompile("`([a-z]\\w*)\\.([A-Z]\\w*)`")
	opName  = regexp.MustCompile(`^[A-Z]\w*$`)
)

// checkOperations checks the operation table of design.md §3 (the "who
// calls | operations" table) against the code: every exported method of
// a type a row names (tasks.Engine, machine.Run, machine.Lease) is listed
// in a row of that type — its …Tx twin counts as listed with it, as the
// section says every operation has one — and every name a row lists is a
// method of the type or a function of its package (machine.AcquireLease,
// which makes a Lease).
func (c *checker) checkOperations(doc string) error {
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(doc)))
	if err != nil {
		return err
	}
	type row struct {
		line int
		pkg  string
		ops  []string
	}
	listed := map[string][]row{} // pkg.Type → its rows
	var order []string
	inSection, inTable, seen := false, false, false
	tableLine := 0
	for _, l := range markdownLines(string(src)) {
		switch {
		case strings.HasPrefix(l.text, "## 3."):
			inSection = true
			continue
		case strings.HasPrefix(l.text, "#") && inSection:
			inSection = false
		}
		if !inSection {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(l.text), "|"), "|")
		if len(cells) == 2 && strings.TrimSpace(cells[0]) == "who calls" {
			inTable, seen, tableLine = true, true, l.n
			continue
		}
		if !inTable {
			continue
		}
		if len(cells) != 2 || !strings.HasPrefix(strings.TrimSpace(l.text), "|") {
			inTable = false
			continue
		}
		m := rowType.FindStringSubmatch(cells[0])
		if m == nil {
			continue // the header's rule, or a row about no type (the runner's)
		}
		ops := cells[1]
		if i := strings.Index(ops, ";"); i >= 0 {
			ops = ops[:i] // what follows says what returning does
		}
		var names []string
		for _, part := range strings.Split(ops, ",") {
			part = strings.TrimSpace(part)
			part = strings.TrimPrefix(part, "and ")
			if opName.MatchString(part) {
				names = append(names, part)
			}
		}
		key := m[1] + "." + m[2]
		if _, ok := listed[key]; !ok {
			order = append(order, key)
		}
		listed[key] = append(listed[key], row{l.n, m[1], names})
	}
	if !seen {
		c.fail(doc, 1, "§3 has no \"who calls | operations\" table")
		return nil
	}
	for _, key := range order {
		pkg, typ, _ := strings.Cut(key, ".")
		if _, t := c.ix.lookupType(pkg, typ); t == nil {
			c.fail(doc, listed[key][0].line, "the operation table names %s, which is no type", key)
			continue
		}
		methods := c.ix.methodSet(pkg, typ)
		names := map[string]bool{}
		for _, r := range listed[key] {
			for _, n := range r.ops {
				names[n] = true
				if !methods[n] && !c.ix.pkgs[pkg].funcs[n] {
					c.fail(doc, r.line, "the operation table lists %s for %s, which has no such method (nor is it a function of %s)", n, key, pkg)
				}
			}
		}
		var missing []string
		for m := range methods {
			if names[m] || strings.HasSuffix(m, "Tx") && names[strings.TrimSuffix(m, "Tx")] {
				continue
			}
			missing = append(missing, m)
		}
		slices.Sort(missing)
		for _, m := range missing {
			c.fail(doc, listed[key][0].line, "%s.%s is not in the operation table (line %d): list it in a row of %s", key, m, tableLine, key)
		}
	}
	return nil
}
