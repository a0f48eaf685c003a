package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                "",
		"chat_turn":                       "chat_turn",
		"héllo wörld 日本語 🙂 a\u00a0b":      "héllo wörld 日本語 🙂 a\u00a0b",
		`C:\temp "quoted"`:                `C:\temp "quoted"`,
		"\x1b]0;pwned\x07":                `\x1b]0;pwned\a`,
		"a\x1b[2Jb":                       `a\x1b[2Jb`,
		"one\ntwo\r\tthree\x00\x7f":       `one\ntwo\r\tthree\x00\x7f`,
		"c1 \u009b31m, next line \u0085":  `c1 \u009b31m, next line \u0085`,
		"abc\u202edef\u2066\u200b\u2028":  `abc\u202edef\u2066\u200b\u2028`,
		"bad \xff\x9b bytes, \ufffd kept": `bad \xff\x9b bytes, ` + "\ufffd kept",
	} {
		require.Equal(t, want, printable(in), "printable(%q)", in)
	}
	require.Equal(t, `a\x1b`+"\n    "+`b\r`, printableLines("a\x1b\nb\r", "\n    "))
}

// TestHostileText builds a conversation whose every free-text field holds
// terminal escape sequences, C1 controls, bidi overrides and forged line
// breaks, and runs every command that prints it: none lets a control
// character through, and each shows it escaped, in its place.
func TestHostileText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.conv = "chat\x1b[2J\u202e"
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn\x1b]0;pwned\x07",
		IdempotencyKey: "key\x1b[K\u202e", Input: json.RawMessage("{\"text\": \"a\u009b31mb\u202ec\x7fd \\u001b[5m\"}")})
	require.NoError(t, err)
	// b.create's input quotes the kind as Go does, which is not JSON here.
	create := func(owner int64, kind string) arbortype.Task {
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: owner, Kind: kind})
		require.NoError(t, err)
		return task
	}
	run := b.start(t, turn.ID)
	tool := b.start(t, create(turn.ID, "tool\x1b[1A\r").ID)
	_, err = b.engine.Fail(b.ctx, tool.ID, tool.Token, arbortype.TaskError{Code: "code\x1b[5m",
		Message: "line one\x1b[2K\nline two\r\u202eowt"})
	require.NoError(t, err)
	_, err = b.engine.SleepUntil(b.ctx, run.ID, run.Token, time.Now().Add(time.Hour), "nap\x1b[8m\n", json.RawMessage("[\"\u0085\"]"))
	require.NoError(t, err)
	victim := create(0, "victim\u009b2J")
	cancelled := create(0, "cancelled\x1b\\")
	// A lease within the day a lease may run (a longer one is a violation
	// the checker reports, and the check below must find none).
	b.setHolder(t, b.conv, "node\x1b]8;;http://evil\x07", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	require.Equal(t, []int64{1, 2, 3, 4}, []int64{turn.ID, tool.ID, victim.ID, cancelled.ID})

	printed := func(r result) string {
		t.Helper()
		requireNoControls(t, r.stdout, "\n")
		requireNoControls(t, r.stderr, "\n\t")
		return r.stdout
	}
	conv := `chat\x1b[2J\u202e`
	require.Equal(t, `conversation `+conv+`
├── #1 turn\x1b]0;pwned\a [sleeping] phase=nap\x1b[8m\n attempt=0 wakes at `+formatTime(b.get(t, 1).WakeAt)+`
│   └── #2 tool\x1b[1A\r [failed] attempt=0 error="line one\x1b[2K\nline two\r\u202eowt"
├── #3 victim\u009b2J [pending] attempt=0
└── #4 cancelled\x1b\ [pending] attempt=0
`, printed(b.arbor(t, "tree", b.conv, "--no-age").ok(t)))

	out := printed(b.arbor(t, "show", "1").ok(t))
	for _, want := range []string{
		"task #1 " + `turn\x1b]0;pwned\a` + "\n",
		"\nconversation        " + conv + "\n",
		"\nphase               " + `nap\x1b[8m\n` + "\n",
		"\nholder              " + `node\x1b]8;;http://evil\a` + " (epoch 2, lease until ",
		"\nidempotency key     " + `key\x1b[K\u202e` + "\n",
		"\ninput:\n  {\n    " + `"text": "a\u009b31mb\u202ec\x7fd \u001b[5m"` + "\n  }\n",
		"\nstate:\n  [\n    " + `"\u0085"` + "\n  ]\n",
		"\nchildren (1):\n  #2 " + `tool\x1b[1A\r` + " [failed]\n",
	} {
		require.Contains(t, out, want)
	}
	out = printed(b.arbor(t, "show", "2").ok(t))
	require.Contains(t, out, "\nowner               #1 "+`turn\x1b]0;pwned\a`+" [sleeping]\n")
	require.Contains(t, out, "\nerror:\n  code: "+`code\x1b[5m`+"\n  message: "+`line one\x1b[2K`+"\n    "+`line two\r\u202eowt`+"\n")

	out = printed(b.arbor(t, "ls").ok(t))
	require.Contains(t, out, "\n"+conv+"  3 ")
	require.Contains(t, out, `  node\x1b]8;;http://evil\a  `)

	require.Equal(t, "no violations (conversation "+conv+")\n", printed(b.arbor(t, "check", b.conv).ok(t)))
	require.Equal(t, "wake #1 "+`turn\x1b]0;pwned\a`+":\n  #1 "+`turn\x1b]0;pwned\a`+": sleeping → pending\n",
		printed(b.arbor(t, "wake", "1").ok(t)))
	require.Equal(t, "abort #3 "+`victim\u009b2J`+": settled 1 task, leaves first:\n  #3 "+`victim\u009b2J`+": pending → orphaned\n",
		printed(b.arbor(t, "abort", "3").ok(t)))
	require.Equal(t, "cancel #4 "+`cancelled\x1b\`+":\n  #4 "+`cancelled\x1b\`+": pending → cancelled\n",
		printed(b.arbor(t, "cancel", "4").ok(t)))
	b.requireInvariants(t)

	// Errors that echo what they were given: the one line is escaped, the
	// flag package's message in it too.
	r := b.arbor(t, "cancel", "1", "--result", "{\x1b[2J")
	r.fails(t, 1, `cancel: --result is not valid JSON: {\x1b[2J`)
	printed(r)
	r = b.arbor(t, "tree", "nope\x1b[2J\u202e")
	r.fails(t, 1, `conversation "nope\x1b[2J\u202e" not found`)
	printed(r)
	r = b.arbor(t, "show", "--\x1b]0;pwned\x07", "1")
	r.fails(t, 1, "arbor: show: flag provided but not defined: -"+`\x1b]0;pwned\a`+" (see arbor show --help)\n")
	printed(r)
}

// requireNoControls requires that s be UTF-8 with no rune that is neither
// visible nor a space, except those in allowed.
func requireNoControls(t *testing.T, s, allowed string) {
	t.Helper()
	require.True(t, utf8.ValidString(s), "not UTF-8: %q", s)
	for i, r := range s {
		if !unicode.IsGraphic(r) && !strings.ContainsRune(allowed, r) {
			require.Fail(t, fmt.Sprintf("%U at byte %d", r, i), "in %q", s)
		}
	}
}
