// Package cron parses standard five-field cron expressions and finds the
// times they name, for arbor's schedules (docs/design.md §3.16).
//
// An expression is "minute hour day-of-month month day-of-week", each field
// a comma-separated list of "*", a value, or a range "a-b", any of which may
// take a step "/n" ("*/5", "1-10/2", "5/15" meaning 5-max/15). Months may
// be named JAN…DEC and days SUN…SAT (case-insensitive); day-of-week 7 is
// Sunday, as 0 is. The macros @yearly (@annually), @monthly, @weekly,
// @daily (@midnight) and @hourly stand for their usual expressions.
//
// Day of month and day of week combine as in Vixie cron: when both are
// restricted (neither field starts with "*"), a day matches if either
// does; otherwise both must.
package cron

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Schedule is a parsed expression. The zero value matches nothing.
type Schedule struct {
	minute, hour, dom, month, dow uint64 // bit i set: value i matches
	domStar, dowStar              bool
}

type field struct {
	name     string
	min, max int
	names    map[string]int
}

var (
	fields = [5]field{
		{name: "minute", min: 0, max: 59},
		{name: "hour", min: 0, max: 23},
		{name: "day of month", min: 1, max: 31},
		{name: "month", min: 1, max: 12, names: map[string]int{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
			"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}},
		{name: "day of week", min: 0, max: 7, names: map[string]int{"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}},
	}
	macros = map[string]string{
		"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
		"@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
	}
)

// ErrSyntax is wrapped by every error of Parse.
var ErrSyntax = errors.New("bad cron expression")

// Parse parses a five-field expression or a macro. An expression that
// names no time at all (day 30 of February) is refused, as is anything
// malformed, with an error wrapping ErrSyntax.
func Parse(expr string) (Schedule, error) {
	text := strings.TrimSpace(expr)
	if m, ok := macros[strings.ToLower(text)]; ok {
		text = m
	}
	parts := strings.Fields(text)
	if len(parts) != 5 {
		return Schedule{}, fmt.Errorf("%w %q: want 5 fields (minute hour day-of-month month day-of-week), have %d", ErrSyntax, expr, len(parts))
	}
	var bits [5]uint64
	for i, p := range parts {
		b, err := parseField(p, fields[i])
		if err != nil {
			return Schedule{}, fmt.Errorf("%w %q: %s field %q: %s", ErrSyntax, expr, fields[i].name, p, err)
		}
		bits[i] = b
	}
	if bits[4]&(1<<7) != 0 {
		bits[4] = bits[4]&^(1<<7) | 1 // 7 is Sunday
	}
	s := Schedule{minute: bits[0], hour: bits[1], dom: bits[2], month: bits[3], dow: bits[4],
		domStar: strings.HasPrefix(parts[2], "*"), dowStar: strings.HasPrefix(parts[4], "*")}
	if s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return Schedule{}, fmt.Errorf("%w %q: it names no time (a day that no month has?)", ErrSyntax, expr)
	}
	return s, nil
}

func parseField(text string, f field) (uint64, error) {
	var bits uint64
	for _, item := range strings.Split(text, ",") {
		rng, stepText, hasStep := strings.Cut(item, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepText)
			if err != nil || n < 1 || n > f.max {
				return 0, fmt.Errorf("step %q is not a number from 1 to %d", stepText, f.max)
			}
			step = n
		}
		lo, hi := f.min, f.max
		switch {
		case rng == "*":
		case strings.Contains(rng, "-"):
			a, b, _ := strings.Cut(rng, "-")
			var err error
			if lo, err = value(a, f); err != nil {
				return 0, err
			}
			if hi, err = value(b, f); err != nil {
				return 0, err
			}
			if lo > hi {
				return 0, fmt.Errorf("range %q runs backwards", rng)
			}
		default:
			v, err := value(rng, f)
			if err != nil {
				return 0, err
			}
			lo = v
			if !hasStep {
				hi = v
			}
		}
		for v := lo; v <= hi; v += step {
			bits |= 1 << uint(v)
		}
	}
	return bits, nil
}

func value(text string, f field) (int, error) {
	if v, ok := f.names[strings.ToLower(text)]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(text)
	if err != nil || v < f.min || v > f.max {
		return 0, fmt.Errorf("%q is not a value from %d to %d", text, f.min, f.max)
	}
	return v, nil
}

// searchYears bounds Next's search: every expression Parse accepts names a
// time within any span of this many years (a 29 February within 8, across a
// century that skips a leap year).
const searchYears = 9

// Next returns the first time the schedule names strictly after after, in
// after's location, to the minute; the zero time if there is none within
// searchYears. Times are wall clock times of the location: a wall time that
// a daylight saving change skips is taken as it reads after the change
// (02:30 is 03:30 where 02:00 jumps to 03:00), and one that occurs twice
// names its first occurrence only.
func (s Schedule) Next(after time.Time) time.Time {
	loc := after.Location()
	// Walk the wall clock, minute by minute at the finest, skipping whole
	// months, days and hours that cannot match.
	w := after.Truncate(time.Second)
	y, mo, d := w.Date()
	h, mi := w.Hour(), w.Minute()+1
	limit := y + searchYears
	for y <= limit {
		if mi > 59 {
			mi, h = 0, h+1
		}
		if h > 23 {
			h, d = 0, d+1
		}
		if d > daysIn(mo, y) {
			d, mo = 1, mo+1
		}
		if mo > 12 {
			mo, y = 1, y+1
			continue
		}
		switch {
		case s.month&(1<<uint(mo)) == 0:
			mo, d, h, mi = mo+1, 1, 0, 0
			if mo > 12 {
				mo, y = 1, y+1
			}
		case !s.dayMatches(y, mo, d):
			d, h, mi = d+1, 0, 0
		case s.hour&(1<<uint(h)) == 0:
			h, mi = h+1, 0
		case s.minute&(1<<uint(mi)) == 0:
			mi++
		default:
			t := time.Date(y, mo, d, h, mi, 0, 0, loc)
			if t.Hour() != h || t.Minute() != mi {
				// A wall time a daylight saving change skips: taken as it
				// reads after the change (02:30 is 03:30 where 02:00
				// jumps to 03:00).
				_, before := t.Zone()
				_, later := t.Add(12 * time.Hour).Zone()
				if later > before {
					t = t.Add(time.Duration(later-before) * time.Second)
				}
			}
			if t.After(after) {
				return t
			}
			mi++
		}
	}
	return time.Time{}
}

func (s Schedule) dayMatches(y int, mo time.Month, d int) bool {
	dom := s.dom&(1<<uint(d)) != 0
	dow := s.dow&(1<<uint(time.Date(y, mo, d, 0, 0, 0, 0, time.UTC).Weekday())) != 0
	if s.domStar || s.dowStar {
		return dom && dow
	}
	return dom || dow
}

func daysIn(m time.Month, y int) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
