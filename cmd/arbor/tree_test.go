package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

func TestTreeDrawsTheConversation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)

	// --no-age makes the drawing exact; the flag may stand before or after
	// the conversation.
	want := fmt.Sprintf(`conversation %s
├── #1 chat_turn [waiting] phase=gathering attempt=0 waits all_settled on #2 #3 #4
│   ├── #2 search_web [completed] attempt=0
│   ├── #3 read_docs [failed] attempt=0 error="docs server returned 503"
│   ├── #4 ask_approval [pending] attempt=0
│   └── #5 summarize_history [running] attempt=0 (background)
└── #6 chat_turn [running] attempt=0
    └── #7 sub_agent [completing] attempt=0 holds its result, waits on #8
        └── #8 browse [pending] attempt=0
`, b.conv)
	require.Equal(t, want, b.arbor(t, "tree", b.conv, "--no-age").ok(t).stdout)
	require.Equal(t, want, b.arbor(t, "tree", "--no-age", b.conv).ok(t).stdout)

	// Without --no-age every line carries an age; masked, it is the same tree.
	aged := b.arbor(t, "tree", b.conv).ok(t).stdout
	ageRE := regexp.MustCompile(` age=[0-9.]+(ms|s|m[0-9]{2}s)`)
	require.Len(t, ageRE.FindAllString(aged, -1), 8, aged)
	require.Equal(t, want, ageRE.ReplaceAllString(aged, ""))
}

func TestTreeEmptyAndUnknownConversation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.arbor(t, "tree", b.conv).fails(t, 1, fmt.Sprintf("conversation %q not found", b.conv))
}

// treeRow is the part of a task of tree --json this test reads back.
type treeRow struct {
	ID         int64           `json:"id"`
	OwnerID    *int64          `json:"owner_id"`
	Kind       string          `json:"kind"`
	Status     string          `json:"status"`
	Background bool            `json:"background"`
	Phase      string          `json:"phase"`
	WaitPolicy string          `json:"wait_policy"`
	WaitIDs    []int64         `json:"wait_ids"`
	Input      json.RawMessage `json:"input"`
	State      json.RawMessage `json:"state"`
	Result     json.RawMessage `json:"result"`
	Token      int64           `json:"token"`
	Error      *struct {
		Message string `json:"message"`
	} `json:"error"`
	CreatedAt time.Time `json:"created_at"`
}

// treeOutput is tree --json's document.
type treeOutput struct {
	Conversation string    `json:"conversation"`
	Tasks        []treeRow `json:"tasks"`
}

func TestTreeJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)

	out := b.arbor(t, "tree", b.conv, "--json").ok(t).stdout
	var doc treeOutput
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, b.conv, doc.Conversation)
	// The rows as written, to see that each has an owner_id.
	var raw struct {
		Tasks []map[string]json.RawMessage `json:"tasks"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &raw))

	// The shape: every task in id order, each naming its owner, null for
	// the two roots.
	var shape []string
	for i, r := range doc.Tasks {
		owner := "null"
		if r.OwnerID != nil {
			owner = fmt.Sprint(*r.OwnerID)
		}
		require.Equal(t, owner, string(raw.Tasks[i]["owner_id"]))
		shape = append(shape, fmt.Sprintf("%d<%s:%s:%s", r.ID, owner, r.Kind, r.Status))
	}
	require.Equal(t, []string{"1<null:chat_turn:waiting", "2<1:search_web:completed", "3<1:read_docs:failed",
		"4<1:ask_approval:pending", "5<1:summarize_history:running", "6<null:chat_turn:running",
		"7<6:sub_agent:completing", "8<7:browse:pending"}, shape)
	require.NotContains(t, out, `"children"`)

	// The columns, as the database holds them.
	root := doc.Tasks[0]
	require.Equal(t, "gathering", root.Phase)
	require.Equal(t, "all_settled", root.WaitPolicy)
	require.Equal(t, []int64{2, 3, 4}, root.WaitIDs)
	require.JSONEq(t, `{"waiting_for": 3}`, string(root.State))
	require.JSONEq(t, `{"kind": "chat_turn"}`, string(root.Input))
	require.Equal(t, b.get(t, 1).CreatedAt.UTC(), root.CreatedAt.UTC())
	require.JSONEq(t, `{"hits": 3}`, string(doc.Tasks[1].Result))
	require.Equal(t, "docs server returned 503", doc.Tasks[2].Error.Message)
	require.True(t, doc.Tasks[4].Background)
	require.Equal(t, b.get(t, 5).Token, doc.Tasks[4].Token)
	require.NotZero(t, doc.Tasks[4].Token)
}

// TestTreeWatch runs tree --watch, changes the tree underneath it, and
// stops it with Ctrl-C (SIGINT), which is a normal end.
func TestTreeWatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)

	// The watcher's connections carry an application name, so that the test
	// can count its polls in pg_stat_activity.
	appName := testdb.Name("watch")
	url, err := neturl.Parse(testdb.URL(t))
	require.NoError(t, err)
	q := url.Query()
	q.Set("application_name", appName)
	url.RawQuery = q.Encode()
	cmd := exec.Command(arborBin, "tree", b.conv, "--watch", "--interval", "20ms", "--no-age",
		"--database-url", url.String(), "--schema", b.schema)
	cmd.Env = environWithout("ARBOR_DATABASE_URL")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen []string
	waitFor := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "arbor ended before %q; output:\n%s\nstderr: %s", want, strings.Join(seen, "\n"), stderr.String())
				seen = append(seen, l)
				if strings.Contains(l, want) {
					return
				}
			case <-deadline:
				t.Fatalf("no %q within 30s; output:\n%s", want, strings.Join(seen, "\n"))
			}
		}
	}

	waitFor("#1 chat_turn [waiting]")
	waitFor("#8 browse [pending]") // the frame's last line
	// Polls with no change write nothing more (stdout is not a terminal):
	// let the watcher poll a few times, counted by its queries' start times,
	// then change the tree. The next frame must be the changed one.
	polls := map[time.Time]bool{}
	waitUntilT(t, "three polls of the watcher", func() bool {
		var started *time.Time
		err := b.pool.QueryRow(b.ctx, `SELECT max(query_start) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&started)
		require.NoError(t, err)
		if started != nil {
			polls[*started] = true
		}
		return len(polls) >= 3
	})
	_, err = b.engine.Abort(b.ctx, 1)
	require.NoError(t, err)
	waitFor("conversation " + b.conv)
	require.Contains(t, <-lines, "#1 chat_turn [aborted]", "the frame after the first is the changed tree: no frame was written without a change")
	waitFor("#4 ask_approval [orphaned]")

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	require.NoError(t, cmd.Wait(), "stderr: %s", stderr.String())
	require.Empty(t, stderr.String())
	// Two frames: the first tree and the one after the abort.
	require.Equal(t, 2, strings.Count(strings.Join(seen, "\n")+"\n"+drain(lines), "conversation "+b.conv))
}

func drain(lines <-chan string) string {
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	return strings.Join(rest, "\n")
}

// waitUntilT polls cond until it holds; the bound is for a broken test.
func waitUntilT(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFarFromNow: tasks created centuries before or after now (a skewed
// clock, a hand-edited row; PostgreSQL stores years 4713 BC to 294276 AD)
// are drawn with their real age and printed, as text and as JSON, with
// every digit of their year. A task created after 2318 once overflowed the
// age and crashed tree with a stack overflow; a year beyond 9999 failed
// every --json output.
func TestFarFromNow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.create(t, 0, "now", false)
	// Rows the guard refuses (created_at is the database's to stamp): the
	// test writes them with triggers off, as a hand-edit by a superuser
	// would.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO `+pgx.Identifier{b.schema, "tasks"}.Sanitize()+` (conversation_id, kind, created_at)
		VALUES ($1, 'future', '2500-01-01 00:00:00+00'), ($1, 'past', '1500-01-01 00:00:00+00'),
		($1, 'far_future', '20000-01-01 00:00:00+00'), ($1, 'caesar', '0044-03-15 00:00:00+00 BC')`, b.conv)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	b.setHolder(t, b.conv, "node-far", "20000-01-01 00:00:00+00")

	out := b.arbor(t, "tree", b.conv).ok(t).stdout
	days := func(kind string) int {
		m := regexp.MustCompile(` ` + kind + ` \[pending\] attempt=0 age=(-?\d+)d\d\dh\n`).FindStringSubmatch(out)
		require.NotNil(t, m, "%s in:\n%s", kind, out)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	const durationDays = 106751 // the most days a time.Duration holds
	require.Less(t, days("future"), -170000)
	require.Greater(t, days("past"), durationDays)
	require.Less(t, days("far_future"), -6000000)
	require.Greater(t, days("caesar"), 700000)

	var doc struct {
		Tasks []struct {
			Kind      string `json:"kind"`
			CreatedAt string `json:"created_at"`
		} `json:"tasks"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "tree", b.conv, "--json").ok(t).stdout), &doc))
	require.Len(t, doc.Tasks, 5)
	require.Equal(t, "far_future", doc.Tasks[3].Kind)
	// The command and the test share the time zone of the environment.
	require.Equal(t, time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC).Local().Format(time.RFC3339Nano), doc.Tasks[3].CreatedAt)

	require.Contains(t, b.arbor(t, "show", "4").ok(t).stdout, "\ncreated             20000-01-01T00:00:00Z\n")
	out = b.arbor(t, "show", "5").ok(t).stdout
	require.Contains(t, out, "\ncreated             -0043-03-15T00:00:00Z\n", "44 BC is the astronomical year -43")
	require.Contains(t, out, "\nholder              node-far (epoch 1, lease until 20000-01-01T00:00:00Z, held)\n")
	var show struct {
		Conversation struct {
			LeaseExpiresAt string `json:"lease_expires_at"`
		} `json:"conversation"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "show", "4", "--json").ok(t).stdout), &show))
	require.Equal(t, time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC).Local().Format(time.RFC3339Nano), show.Conversation.LeaseExpiresAt)
	require.Contains(t, b.arbor(t, "ls").ok(t).stdout, " node-far  20000-01-01T00:00:00Z\n")
	require.Contains(t, b.arbor(t, "ls", "--json").ok(t).stdout, `"lease_expires_at": "`)
}

// TestTreeTenThousandDeep draws a chain 10,000 tasks deep, plus a second
// child of its root after it, in both formats. The nested JSON of old
// failed near 5,000 levels after taking 2.4 GB, and the drawing grew with
// the square of the depth (200 MB for this tree); now both grow with the
// number of tasks, and the drawing's indentation stops at maxDrawnDepth.
func TestTreeTenThousandDeep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const depth = 10000
	b.create(t, 0, "step", false)
	// One INSERT: ids are assigned in the order of g, from 2 in the test's
	// fresh schema, so each row's owner is the row before it.
	tbl := pgx.Identifier{b.schema, "tasks"}.Sanitize()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO `+tbl+` (conversation_id, owner_task_id, kind)
		SELECT $1, g - 1, 'step' FROM generate_series(2, $2::int) g ORDER BY g`, b.conv, depth)
	require.NoError(t, err)
	sibling := b.create(t, 1, "sibling", false)
	require.Equal(t, int64(depth+1), sibling.ID)
	var chained int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+tbl+` WHERE owner_task_id = id - 1`).Scan(&chained))
	require.Equal(t, depth-1, chained)

	out := b.arbor(t, "tree", b.conv, "--no-age").ok(t).stdout
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 1+depth+1)
	require.Less(t, len(out), 200*(depth+1), "bytes per task bounded, whatever the depth")
	// The root's rail is blank (it is the last root); #2's continues down
	// to its sibling #10001, also past the drawn depth.
	require.Equal(t, "└── #1 step [pending] attempt=0", lines[1])
	require.Equal(t, "    ├── #2 step [pending] attempt=0", lines[2])
	require.Equal(t, "    │   └── #3 step [pending] attempt=0", lines[3])
	require.Equal(t, "    │   "+strings.Repeat("    ", 21)+"└── #24 step [pending] attempt=0", lines[24])
	require.Equal(t, "    │   "+strings.Repeat("    ", 22)+"… (depth 25) #25 step [pending] attempt=0", lines[25])
	require.Equal(t, "    │   "+strings.Repeat("    ", 22)+"… (depth 10000) #10000 step [pending] attempt=0", lines[depth])
	require.Equal(t, "    └── #10001 sibling [pending] attempt=0", lines[depth+1])

	out = b.arbor(t, "tree", b.conv, "--json").ok(t).stdout
	require.Less(t, len(out), 1000*(depth+1), "bytes per task bounded, whatever the depth")
	var doc treeOutput
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc.Tasks, depth+1)
	require.Nil(t, doc.Tasks[0].OwnerID)
	for i, r := range doc.Tasks[1:depth] {
		require.Equal(t, int64(i+2), r.ID)
		require.Equal(t, int64(i+1), *r.OwnerID)
	}
	require.Equal(t, int64(1), *doc.Tasks[depth].OwnerID)

	// show of the deepest task, and check over the whole chain, work too.
	require.Contains(t, b.arbor(t, "show", "10000").ok(t).stdout, "owner               #9999 step [pending]\n")
	b.arbor(t, "check", b.conv).ok(t)
}
