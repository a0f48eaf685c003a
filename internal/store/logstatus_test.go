package store

import (
	"regexp"
	"strings"
	"testing"
)

// TestEveryStatusWriteIsLogged: every statement that inserts a task or
// sets a task's status appends the status entries itself (logged), since
// no trigger does (the schema baseline). The fork's insert is the one exception:
// it copies the source's entries (qInsertForkLog).
func TestEveryStatusWriteIsLogged(t *testing.T) {
	t.Parallel()
	names := statementNames(t)
	update := regexp.MustCompile(`(?s)UPDATE \{schema\}\.tasks\b[^;]*?\bSET\b(.*?)(\bFROM\b|\bWHERE\b|$)`)
	setsStatus := regexp.MustCompile(`(^|[\s,])status\s*=`)
	insert := regexp.MustCompile(`INSERT INTO \{schema\}\.tasks\b`)
	exempt := map[string]string{"qInsertForkTasks": "a fork copies its source's log entries itself (qInsertForkLog)"}
	writes := 0
	for i, sql := range queries {
		name := names[i]
		sets := false
		for _, m := range update.FindAllStringSubmatch(sql, -1) {
			if setsStatus.MatchString(m[1]) {
				sets = true
			}
		}
		if !sets && !insert.MatchString(sql) {
			continue
		}
		writes++
		if _, ok := exempt[name]; ok {
			continue
		}
		if !strings.Contains(sql, "INSERT INTO {schema}.conversation_log") || !strings.Contains(sql, "FROM w ORDER BY w.settle_seq NULLS FIRST, w.id") {
			t.Errorf("%s writes a task's status but does not log it: give it the CTEs w and logged of the other status writes (store/queries/task_write.sql):\n%s", name, sql)
		}
	}
	if writes < 20 {
		t.Fatalf("found %d statements that write a status; the patterns above have stopped matching the store's SQL", writes)
	}
	t.Logf("%d statements write a task's status or insert a task", writes)
}
