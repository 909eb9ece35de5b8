package tick

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCronTicksInItsLocationAndOnceOnDSTDays(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	at := func(y int, m time.Month, d, h, min int) time.Time { return time.Date(y, m, d, h, min, 0, 0, berlin) }
	ticks := func(expr string, from time.Time, n int) []time.Time {
		spec, err := Parse(0, expr, berlin)
		require.NoError(t, err)
		var out []time.Time
		ms := from.UnixMilli()
		for range n {
			ms, err = spec.Next(ms)
			require.NoError(t, err)
			out = append(out, time.UnixMilli(ms).In(berlin))
		}
		return out
	}
	same := func(want, got []time.Time) {
		t.Helper()
		require.Len(t, got, len(want))
		for i := range want {
			assert.True(t, want[i].Equal(got[i]), "tick %d: want %v, got %v", i, want[i], got[i])
		}
	}
	// 2026-03-29: 02:00 CET jumps to 03:00 CEST; the skipped 02:30 ticks
	// once, at the jump.
	same([]time.Time{at(2026, 3, 28, 2, 30), at(2026, 3, 29, 3, 0), at(2026, 3, 30, 2, 30)},
		ticks("30 2 * * *", at(2026, 3, 27, 12, 0), 3))
	// 2026-10-25: 03:00 CEST goes back to 02:00 CET; the repeated 02:30
	// ticks once, the first time.
	first := time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC) // 02:30 CEST
	same([]time.Time{at(2026, 10, 24, 2, 30), first, at(2026, 10, 26, 2, 30)},
		ticks("30 2 * * *", at(2026, 10, 23, 12, 0), 3))
	// An expression whose hour is "*" ticks in real time through the jump.
	got := ticks("*/30 * * * *", at(2026, 10, 25, 1, 50), 5)
	for i := 1; i < len(got); i++ {
		assert.Equal(t, 30*time.Minute, got[i].Sub(got[i-1]), "%v", got)
	}
	// A daily 08:00 is 08:00 local on both sides of the jump.
	same([]time.Time{at(2026, 3, 28, 0, 0), at(2026, 3, 29, 0, 0)}, ticks("@daily", at(2026, 3, 27, 12, 0), 2))
	same([]time.Time{at(2026, 3, 28, 8, 0), at(2026, 3, 29, 8, 0), at(2026, 3, 30, 8, 0)},
		ticks("0 8 * * *", at(2026, 3, 27, 12, 0), 3))
	// "@every 90s" is Every 90s: on its grid.
	spec, err := Parse(0, "@every 90s", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(90_000), spec.Every())
	next, err := spec.Next(90_000)
	require.NoError(t, err)
	assert.Equal(t, int64(180_000), next)
}

// An expression whose hour is "*" ticks at every moment whose clock reads a
// match, where the clock jumps at midnight too, and ends on a day a zone
// skipped.
func TestWildHourTicksAtEveryReadingThatMatches(t *testing.T) {
	load := func(name string) *time.Location {
		loc, err := time.LoadLocation(name)
		require.NoError(t, err)
		return loc
	}
	cairo, beirut, berlin, apia := load("Africa/Cairo"), load("Asia/Beirut"), load("Europe/Berlin"), load("Pacific/Apia")
	for _, c := range []struct {
		expr  string
		loc   *time.Location
		after time.Time
		want  []string
	}{
		// Cairo's clock jumps from 00:00 to 01:00 on 2026-04-24.
		{"0 * 24 4 *", cairo, time.Date(2026, 4, 23, 12, 0, 0, 0, time.UTC), []string{"2026-04-24 01:00 EEST", "2026-04-24 02:00 EEST"}},
		{"30 * * * 5", cairo, time.Date(2026, 4, 23, 12, 0, 0, 0, time.UTC), []string{"2026-04-24 01:30 EEST", "2026-04-24 02:30 EEST"}},
		// Beirut's jumps from 00:00 to 01:00 on 2026-03-29.
		{"0 * * * 0", beirut, time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC), []string{"2026-03-29 01:00 EEST", "2026-03-29 02:00 EEST"}},
		// Berlin's repeats 02:00-03:00 on 2026-10-25: both readings tick.
		{"0 * * * *", berlin, time.Date(2026, 10, 24, 23, 30, 0, 0, time.UTC), []string{"2026-10-25 02:00 CEST", "2026-10-25 02:00 CET", "2026-10-25 03:00 CET"}},
		// Apia skipped 2011-12-30 altogether.
		{"0 * 30 12 *", apia, time.Date(2011, 12, 28, 12, 0, 0, 0, time.UTC), []string{"2012-12-30 00:00 +14"}},
	} {
		spec, err := Parse(0, c.expr, c.loc)
		require.NoError(t, err)
		ms := c.after.UnixMilli()
		var got []string
		for range c.want {
			ms, err = spec.Next(ms)
			require.NoError(t, err, c.expr)
			got = append(got, time.UnixMilli(ms).In(c.loc).Format("2006-01-02 15:04 MST"))
		}
		assert.Equal(t, c.want, got, "%s in %v", c.expr, c.loc)
	}
}
