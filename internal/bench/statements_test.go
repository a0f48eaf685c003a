package bench

import (
	"reflect"
	"testing"
)

// TestStatementsBetween: the window's share of each statement is the
// difference of its two samples; a statement without a call in between is
// left out, one first seen in the window counts in full, one the server
// evicted and counted again (fewer calls after than before) counts from
// zero, and the largest time comes first.
func TestStatementsBetween(t *testing.T) {
	before := stmtSample{
		{1, true}:  {Query: "a", TopLevel: true, Calls: 10, Rows: 10, ExecMS: 5, WALBytes: 100},
		{2, false}: {Query: "b", Calls: 3, Rows: 3, ExecMS: 1, WALBytes: 30},
		{4, true}:  {Query: "d", TopLevel: true, Calls: 50, Rows: 50, ExecMS: 9, WALBytes: 900},
	}
	after := stmtSample{
		{1, true}:  {Query: "a", TopLevel: true, Calls: 14, Rows: 18, ExecMS: 6, PlanMS: 2, WALBytes: 180},
		{2, false}: {Query: "b", Calls: 3, Rows: 3, ExecMS: 1, WALBytes: 30},
		{3, true}:  {Query: "c", TopLevel: true, Calls: 2, Rows: 0, ExecMS: 7, WALBytes: 0},
		{4, true}:  {Query: "d", TopLevel: true, Calls: 5, Rows: 5, ExecMS: 0.5, WALBytes: 40},
	}
	got := statementsBetween(before, after)
	want := []StatementShare{
		{Query: "c", TopLevel: true, Calls: 2, Rows: 0, ExecMS: 7, WALBytes: 0},
		{Query: "a", TopLevel: true, Calls: 4, Rows: 8, ExecMS: 1, PlanMS: 2, WALBytes: 80},
		{Query: "d", TopLevel: true, Calls: 5, Rows: 5, ExecMS: 0.5, WALBytes: 40},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("statementsBetween:\n got %+v\nwant %+v", got, want)
	}
}
