package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHumanDuration covers every unit and both ends of the Duration range,
// whose negative end once recursed forever: -math.MinInt64 is MinInt64.
func TestHumanDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                 "0ms",
		999 * time.Microsecond:            "0ms",
		-999 * time.Microsecond:           "0ms",
		850 * time.Millisecond:            "850ms",
		-850 * time.Millisecond:           "-850ms",
		12345 * time.Millisecond:          "12.3s",
		59999 * time.Millisecond:          "59.9s",
		4*time.Minute + 5*time.Second:     "4m05s",
		3*time.Hour + 2*time.Minute:       "3h02m",
		-(3*time.Hour + 2*time.Minute):    "-3h02m",
		52 * time.Hour:                    "2d04h",
		math.MaxInt64:                     "106751d23h",
		math.MinInt64:                     "-106751d23h",
		math.MinInt64 + 1:                 "-106751d23h",
		-time.Duration(math.MaxInt64 / 2): "-53375d23h",
	} {
		require.Equal(t, want, humanDuration(d), "humanDuration(%d)", int64(d))
	}
}

// TestAgeBeyondADuration: two times more than 292 years apart, whose
// difference time.Time.Sub saturates, still get their real age.
func TestAgeBeyondADuration(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, "3h02m", age(now, now.Add(-3*time.Hour-2*time.Minute)))
	require.Equal(t, "-1d00h", age(now, now.AddDate(0, 0, 1)))
	// 2026-01-01 minus 1500-01-01: 526 years with 128 leap days.
	require.Equal(t, "192118d00h", age(now, time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC)))
	require.Equal(t, "-172760d00h", age(now, time.Date(2499, 1, 1, 0, 0, 0, 0, time.UTC)))
	// PostgreSQL's extremes, 4713 BC (year -4712) and 294276 AD.
	require.Equal(t, "2461003d12h", age(now, time.Date(-4712, 1, 1, 12, 0, 0, 0, time.UTC)))
	require.Equal(t, "-106742485d00h", age(now, time.Date(294276, 12, 31, 0, 0, 0, 0, time.UTC)))
}

func TestFormatTime(t *testing.T) {
	t.Parallel()
	at := func(year int) *time.Time {
		t := time.Date(year, 3, 15, 12, 0, 0, 0, time.FixedZone("CET", 3600))
		return &t
	}
	require.Equal(t, "-", formatTime(nil))
	require.Equal(t, "2026-03-15T11:00:00Z", formatTime(at(2026)))
	require.Equal(t, "20000-03-15T11:00:00Z", formatTime(at(20000)))
	require.Equal(t, "-0043-03-15T11:00:00Z", formatTime(at(-43)))

	b, err := jsonTime(*at(20000)).MarshalJSON()
	require.NoError(t, err)
	require.Equal(t, `"20000-03-15T12:00:00+01:00"`, string(b))
	b, err = jsonTime(*at(2026)).MarshalJSON()
	require.NoError(t, err)
	want, err := at(2026).MarshalJSON()
	require.NoError(t, err)
	require.Equal(t, string(want), string(b), "within RFC 3339's years, as time.Time writes it")
}
