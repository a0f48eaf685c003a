package fsmgen

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A region is one generated text written whole into a migration: the
// lines between its BEGIN and END lines in a migration's up file. Each
// migration stays plain SQL a reader can read top to bottom; the lines
// only say which part `go generate ./fsm` writes.
type region struct {
	Name string // the word on the BEGIN and END lines
	Text func() string
}

var regions = []region{
	{Name: "guard", Text: GuardSQL},
	{Name: "records", Text: RecordGuardSQL},
}

func begin(name string) string {
	return "-- BEGIN arbor:" + name + " (written by go generate ./fsm from package fsm; do not edit)\n"
}

func end(name string) string { return "-- END arbor:" + name + "\n" }

// Files returns every file `go generate ./fsm` writes, by path under root
// (the repository), with its content: docs/state-machine.md, and each
// migration whose up file holds a region (see Migration). internal/cmd/fsmgen
// writes them, and TestGeneratedFilesUpToDate compares them with the
// repository.
func Files(root string) (map[string]string, error) {
	files := map[string]string{filepath.Join(root, "docs", "state-machine.md"): Mermaid()}
	ups, err := filepath.Glob(filepath.Join(root, "migrations", "sql", "*.up.sql"))
	if err != nil {
		return nil, err
	}
	slices.Sort(ups) // by version: the names start with it, zero-padded
	read := func(path string) (string, error) {
		if s, ok := files[path]; ok {
			return s, nil
		}
		b, err := os.ReadFile(path)
		return string(b), err
	}
	for _, r := range regions {
		// The newest migration that writes this region gets the current
		// text; its down file, if it holds the region too, gets the text of
		// the migration before that wrote it, so that down restores it.
		var holders []string
		for _, path := range ups {
			body, err := read(path)
			if err != nil {
				return nil, err
			}
			if strings.Contains(body, begin(r.Name)) {
				holders = append(holders, path)
			}
		}
		if len(holders) == 0 {
			return nil, fmt.Errorf("fsmgen: no migration in %s holds the line %q", filepath.Join(root, "migrations", "sql"), strings.TrimSpace(begin(r.Name)))
		}
		newest := holders[len(holders)-1]
		body, err := read(newest)
		if err != nil {
			return nil, err
		}
		if files[newest], err = replace(newest, body, r.Name, r.Text()); err != nil {
			return nil, err
		}
		down := strings.TrimSuffix(newest, ".up.sql") + ".down.sql"
		body, err = read(down)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(body, begin(r.Name)) {
			continue
		}
		if len(holders) == 1 {
			return nil, fmt.Errorf("fsmgen: %s holds the region %s, but no migration before it wrote one to restore", down, r.Name)
		}
		previous, err := read(holders[len(holders)-2])
		if err != nil {
			return nil, err
		}
		text, err := regionText(previous, r.Name)
		if err != nil {
			return nil, fmt.Errorf("fsmgen: %s: %w", holders[len(holders)-2], err)
		}
		if files[down], err = replace(down, body, r.Name, text); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// regionText returns the text of the region name in a migration's SQL: what
// lies between its BEGIN and END lines.
func regionText(sql, name string) (string, error) {
	_, rest, ok := strings.Cut(sql, begin(name))
	if !ok {
		return "", fmt.Errorf("no line %q", strings.TrimSpace(begin(name)))
	}
	text, _, ok := strings.Cut(rest, end(name))
	if !ok {
		return "", fmt.Errorf("the region %s has no line %q", name, strings.TrimSpace(end(name)))
	}
	return text, nil
}

// replace puts text between the BEGIN and END lines of region name in
// body, the file at path.
func replace(path, body, name, text string) (string, error) {
	if strings.Count(body, begin(name)) != 1 {
		return "", fmt.Errorf("fsmgen: %s holds the line %q more than once", path, strings.TrimSpace(begin(name)))
	}
	before, rest, _ := strings.Cut(body, begin(name))
	_, after, ok := strings.Cut(rest, end(name))
	if !ok {
		return "", fmt.Errorf("fsmgen: %s: the region %s has no line %q", path, name, strings.TrimSpace(end(name)))
	}
	return before + begin(name) + text + end(name) + after, nil
}
