package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// snippet is one ```go block of a Markdown file.
type snippet struct {
	// file is the Markdown file, as errors name it; line is the line of
	// the block's first line of code (after the fence).
	file string
	line int
	code string
	// skip is the reason given by a skip marker on the line before the
	// fence, "" when there is none.
	skip string
}

// skipMarker, alone on the line before a fence, keeps a deliberately
// partial snippet out of the check; what follows it up to "-->" says why:
//
//	<!-- snippet: skip: a fragment of a handler map -->
const skipMarker = "<!-- snippet: skip"

// extract returns the ```go blocks of the Markdown file path, named name in
// errors. A block is opened by a line that is ```go (trailing spaces
// allowed) and closed by the next line starting with ```.
func extract(path, name string) ([]snippet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out     []snippet
		cur     *snippet
		code    strings.Builder
		prev    string
		lineNum int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lineNum++
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimRight(line, " \t") == "```go":
			cur = &snippet{file: name, line: lineNum + 1}
			if m, ok := strings.CutPrefix(strings.TrimSpace(prev), skipMarker); ok {
				reason := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m), "-->"))
				reason = strings.TrimSpace(strings.TrimPrefix(reason, ":"))
				if reason == "" {
					reason = "marked partial"
				}
				cur.skip = reason
			}
			code.Reset()
		case cur != nil && strings.HasPrefix(line, "```"):
			cur.code = code.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			code.WriteString(line)
			code.WriteByte('\n')
		}
		prev = line
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a ```go block is not closed", name, cur.line-1)
	}
	return out, nil
}
