package arborui_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
)

// TestSchedules: the schedules page lists each schedule with its timing,
// tenant, kind, policy, state and ticks, is linked from every page's
// navigation, and escapes what a user named (a hostile name, kind, tenant
// or conversation is text, never markup).
func TestSchedules(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Prefix: "/ops"})
	code, page := b.get(t, "/schedules")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `id="none"`)
	require.Contains(t, page, `href="/ops/schedules" id="nav-schedules" class="here"`)

	hostile := `<script>alert(1)</script>"'&`
	_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "nightly", Kind: "digest", Cron: "0 2 * * *",
		TimeZone: "Europe/Paris", Tenant: "acme", Missed: arbortype.MissedRunOnce})
	require.NoError(t, err)
	_, err = b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: hostile, Kind: hostile, Every: 10 * time.Minute,
		Tenant: hostile, ConversationID: hostile})
	require.NoError(t, err)
	_, err = b.engine.PauseSchedule(b.ctx, hostile)
	require.NoError(t, err)

	code, page = b.get(t, "/schedules")
	require.Equal(t, http.StatusOK, code, page)
	require.NotContains(t, page, "<script>alert")
	require.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;")
	rows := strings.Split(page[strings.Index(page, "<tbody>"):], "<tr ")
	require.Len(t, rows, 3, page) // the tbody's head, then a row per schedule, by name
	hostileRow, nightly := rows[1], rows[2]
	require.Contains(t, nightly, `data-schedule="nightly"`)
	require.Contains(t, nightly, "acme")
	require.Contains(t, nightly, "digest")
	require.Contains(t, nightly, "<code>0 2 * * *</code>")
	require.Contains(t, nightly, "Europe/Paris")
	require.Contains(t, nightly, "a new one per tick")
	require.Contains(t, nightly, "run_once")
	require.Contains(t, nightly, "active")
	require.Contains(t, nightly, "none yet")
	require.Contains(t, nightly, ":00:00.000Z")
	require.Contains(t, hostileRow, "every 10m0s")
	require.Contains(t, hostileRow, "paused")
	require.Contains(t, hostileRow, "skip")
	require.Contains(t, hostileRow, `href="/ops/conversation?id=%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%26"`)

	// Every page links to it.
	_, page = b.get(t, "/nodes")
	require.Contains(t, page, `href="/ops/schedules" id="nav-schedules"`)
}
