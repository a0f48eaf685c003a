package cron

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestNext(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		expr, after string
		want        []string // the next times, in order
	}{
		{"* * * * *", "2026-01-01T00:00:00Z", []string{"2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"}},
		{"* * * * *", "2026-01-01T00:00:30Z", []string{"2026-01-01T00:01:00Z"}},
		{"*/5 * * * *", "2026-01-01T00:03:00Z", []string{"2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z"}},
		{"*/5 * * * *", "2026-01-01T00:55:00Z", []string{"2026-01-01T01:00:00Z"}},
		{"1-10/2 * * * *", "2026-01-01T00:00:00Z", []string{"2026-01-01T00:01:00Z", "2026-01-01T00:03:00Z", "2026-01-01T00:05:00Z", "2026-01-01T00:07:00Z", "2026-01-01T00:09:00Z", "2026-01-01T01:01:00Z"}},
		{"5/20 * * * *", "2026-01-01T00:00:00Z", []string{"2026-01-01T00:05:00Z", "2026-01-01T00:25:00Z", "2026-01-01T00:45:00Z", "2026-01-01T01:05:00Z"}},
		{"0,30 9 * * *", "2026-01-01T09:00:00Z", []string{"2026-01-01T09:30:00Z", "2026-01-02T09:00:00Z"}},
		{"0 0 1 * *", "2026-01-15T00:00:00Z", []string{"2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"}},
		{"0 0 31 * *", "2026-01-31T00:00:00Z", []string{"2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z"}},
		{"0 0 29 2 *", "2026-01-01T00:00:00Z", []string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"0 12 * * MON-FRI", "2026-12-04T12:00:00Z", []string{"2026-12-07T12:00:00Z", "2026-12-08T12:00:00Z"}}, // Friday 4 December 2026
		{"0 12 * * 0", "2026-12-05T00:00:00Z", []string{"2026-12-06T12:00:00Z", "2026-12-13T12:00:00Z"}},
		{"0 12 * * 7", "2026-12-05T00:00:00Z", []string{"2026-12-06T12:00:00Z"}},
		{"0 0 * JAN,jul *", "2026-02-01T00:00:00Z", []string{"2026-07-01T00:00:00Z"}},
		// Both days restricted: either matches (the 13th, or a Friday).
		{"0 0 13 * 5", "2026-12-01T00:00:00Z", []string{"2026-12-04T00:00:00Z", "2026-12-11T00:00:00Z", "2026-12-13T00:00:00Z", "2026-12-18T00:00:00Z"}},
		// One starts with "*": both must (a Friday the 13th).
		{"0 0 */1 * 5", "2026-12-01T00:00:00Z", []string{"2026-12-04T00:00:00Z"}},
		{"0 0 13 * *", "2026-12-01T00:00:00Z", []string{"2026-12-13T00:00:00Z"}},
		{"@hourly", "2026-01-01T00:59:59Z", []string{"2026-01-01T01:00:00Z"}},
		{"@daily", "2026-01-01T00:00:00Z", []string{"2026-01-02T00:00:00Z"}},
		{"@weekly", "2026-12-06T00:00:00Z", []string{"2026-12-13T00:00:00Z"}},
		{"@monthly", "2026-12-06T00:00:00Z", []string{"2027-01-01T00:00:00Z"}},
		{"@yearly", "2026-12-06T00:00:00Z", []string{"2027-01-01T00:00:00Z"}},
		{"59 23 31 12 *", "2026-12-31T23:59:00Z", []string{"2027-12-31T23:59:00Z"}},
	} {
		s, err := Parse(c.expr)
		require.NoError(t, err, c.expr)
		got := at(c.after)
		for _, w := range c.want {
			got = s.Next(got)
			require.Equal(t, at(w), got.UTC(), "%s after %s", c.expr, c.after)
		}
	}
}

func TestNextInAZone(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	s, err := Parse("0 9 * * *")
	require.NoError(t, err)
	// 09:00 in New York is 14:00 UTC in winter, 13:00 in summer.
	require.Equal(t, at("2026-12-06T14:00:00Z"), s.Next(at("2026-12-06T00:00:00Z").In(ny)).UTC())
	require.Equal(t, at("2026-07-06T13:00:00Z"), s.Next(at("2026-07-06T00:00:00Z").In(ny)).UTC())

	// 8 March 2026: 02:00 to 03:00 does not exist; 02:30 is taken an hour later, once.
	s, err = Parse("30 2 * * *")
	require.NoError(t, err)
	first := s.Next(time.Date(2026, 3, 8, 0, 0, 0, 0, ny))
	require.Equal(t, at("2026-03-08T07:30:00Z"), first.UTC(), "03:30 EDT")
	require.Equal(t, at("2026-03-09T06:30:00Z"), s.Next(first).UTC())

	// 1 November 2026: 01:00 to 02:00 happens twice; 01:30 names the first only.
	s, err = Parse("30 1 * * *")
	require.NoError(t, err)
	first = s.Next(time.Date(2026, 11, 1, 0, 0, 0, 0, ny))
	require.Equal(t, at("2026-11-01T05:30:00Z"), first.UTC(), "01:30 EDT")
	require.Equal(t, at("2026-11-02T06:30:00Z"), s.Next(first).UTC(), "then 01:30 EST the next day")

	// Every minute runs through the repeated hour without going back.
	s, err = Parse("* * * * *")
	require.NoError(t, err)
	prev := time.Date(2026, 11, 1, 0, 58, 0, 0, ny)
	for range 200 {
		next := s.Next(prev)
		require.True(t, next.After(prev))
		prev = next
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, expr := range []string{
		"", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 13 * ",
		"* * * * 8", "*/0 * * * *", "*/61 * * * *", "5-1 * * * *", "a * * * *", "1,,2 * * * *", "-1 * * * *",
		"0 0 30 2 *", "0 0 31 4,6,9,11 *", "@every 5m", "@reboot", "* * * FOO *", "1-2-3 * * * *",
	} {
		_, err := Parse(expr)
		require.Error(t, err, "%q", expr)
		require.True(t, errors.Is(err, ErrSyntax), "%q: %v", expr, err)
	}
}

func TestTheZeroScheduleNamesNothing(t *testing.T) {
	t.Parallel()
	require.True(t, Schedule{}.Next(at("2026-01-01T00:00:00Z")).IsZero())
}
