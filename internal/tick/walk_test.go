package tick

import (
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/zones"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The walk: every zone of both zone databases, every expression below,
// each tick from walkFrom to walkTo compared with the rule worked out
// independently (an oracle over the zone's offsets). By default it walks
// the days where a clock can betray a computation: three days around each
// change of offset, and the turn of every year. DQ_SOAK=1 walks every day.
var (
	walkFrom = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	walkTo   = time.Date(2100, 12, 31, 0, 0, 0, 0, time.UTC)
)

// walked is a cron expression of a fixed hour with the dates it matches,
// in the way the oracle reads it.
type walked struct {
	expr    string
	minutes []int
	hours   []int
	date    func(y int, m time.Month, d int, wd time.Weekday) bool
}

func daily(y int, m time.Month, d int, wd time.Weekday) bool { return true }

var walkedExprs = []walked{
	{"0 3 * * *", []int{0}, []int{3}, daily},
	{"30 2 * * *", []int{30}, []int{2}, daily},
	{"@daily", []int{0}, []int{0}, daily},
	// Every half hour of the hours when clocks change, and a few others:
	// matches that a jump skips fold into one tick at the jump.
	{"0,30 0-3,12,23 * * *", []int{0, 30}, []int{0, 1, 2, 3, 12, 23}, daily},
	{"0 2 * * 0", []int{0}, []int{2}, func(_ int, _ time.Month, _ int, wd time.Weekday) bool { return wd == time.Sunday }},
	{"30 0 * * 5,6", []int{30}, []int{0}, func(_ int, _ time.Month, _ int, wd time.Weekday) bool {
		return wd == time.Friday || wd == time.Saturday
	}},
	{"30 2 1 * *", []int{30}, []int{2}, func(_ int, _ time.Month, d int, _ time.Weekday) bool { return d == 1 }},
	{"0 0 31 * *", []int{0}, []int{0}, func(_ int, _ time.Month, d int, _ time.Weekday) bool { return d == 31 }},
	{"@yearly", []int{0}, []int{0}, func(_ int, m time.Month, d int, _ time.Weekday) bool { return m == 1 && d == 1 }},
	{"30 2 * 3,10 *", []int{30}, []int{2}, func(_ int, m time.Month, _ int, _ time.Weekday) bool { return m == 3 || m == 10 }},
}

func TestEveryZoneTicksByTheRule(t *testing.T) {
	exhaustive := os.Getenv("DQ_SOAK") == "1"
	for _, db := range zones.Both(t) {
		t.Run(db.Name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			ticks := 0
			seen := map[string]bool{} // zones whose offsets another zone has
			for _, name := range db.Distinct() {
				loc, err := db.Load(name)
				require.NoError(t, err)
				o := offsetsOf(t, loc)
				if data := fmt.Sprint(o.changes); !seen[data] {
					seen[data] = true
					ticks += walkZone(t, o, exhaustive)
				}
			}
			t.Logf("%s database: %d zones (%d distinct), %d ticks compared in %v", db.Name, len(db.Zones), len(seen), ticks, time.Since(start).Round(time.Millisecond))
		})
	}
}

// walkZone compares every expression's ticks in loc with the oracle's, in
// the windows the walk covers; it returns how many ticks it compared.
func walkZone(t *testing.T, o offsets, exhaustive bool) int {
	loc := o.loc
	windows := [][2]int64{{walkFrom.Unix(), walkTo.Unix()}}
	if !exhaustive {
		windows = windows[:0]
		for _, c := range o.changes[1:] {
			if c.start > walkTo.Unix() {
				break
			}
			windows = append(windows, [2]int64{c.start - 36*3600, c.start + 36*3600})
		}
		for y := walkFrom.Year(); y < walkTo.Year(); y++ {
			end := time.Date(y+1, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
			windows = append(windows, [2]int64{end - 60*3600, end + 36*3600})
		}
	}
	n := 0
	for _, e := range walkedExprs {
		spec, err := Parse(0, e.expr, loc)
		require.NoError(t, err)
		for _, w := range windows {
			for ms := w[0] * 1000; ms <= w[1]*1000 && ms <= walkTo.UnixMilli(); {
				want := o.next(e, ms)
				got, err := spec.Next(ms)
				if err != nil || got != want {
					t.Errorf("%s in %v after %v: want %v, got %v (%v)", e.expr, loc, time.UnixMilli(ms).In(loc), at(want, loc), at(got, loc), err)
					return n
				}
				n++
				if got == None {
					break
				}
				ms = got
			}
		}
	}
	return n
}

func at(ms int64, loc *time.Location) string {
	if ms == None {
		return "none"
	}
	return time.UnixMilli(ms).In(loc).Format("2006-01-02 15:04:05 MST")
}

// offsets is a zone's offset from UTC over the walk, as runs that each
// start at a change.
type offsets struct {
	loc     *time.Location
	changes []change // sorted; the first starts before the walk
}

type change struct {
	start  int64 // Unix seconds
	offset int64 // seconds east of UTC, from start on
}

// offsetsOf finds where loc's offset changes over the walk (with the zone's
// bounds, stepping past the bounds some Go releases give on the last day of
// a leap year, go.dev/issue/81583), and checks them against the offset read
// every 25 hours.
func offsetsOf(t *testing.T, loc *time.Location) offsets {
	from, to := walkFrom.Unix()-2*86400, walkTo.Unix()+800*86400
	_, off := time.Unix(from, 0).In(loc).Zone()
	o := offsets{loc: loc, changes: []change{{math.MinInt64, int64(off)}}}
	for s := from; s < to; {
		_, end := time.Unix(s, 0).In(loc).ZoneBounds()
		if end.IsZero() {
			break
		}
		if end.Unix() <= s {
			s += 3600
			continue
		}
		s = end.Unix()
		if _, off := end.Zone(); int64(off) != o.changes[len(o.changes)-1].offset {
			o.changes = append(o.changes, change{s, int64(off)})
		}
	}
	for s := from; s < to; s += 25 * 3600 { // a day and an hour: every hour of the day in turn
		if _, off := time.Unix(s, 0).In(loc).Zone(); int64(off) != o.offset(s) {
			t.Fatalf("%v at %v: offset %d, changes say %d", loc, time.Unix(s, 0).UTC(), off, o.offset(s))
		}
	}
	return o
}

// offset is the offset at the moment s.
func (o offsets) offset(s int64) int64 {
	i := sort.Search(len(o.changes), func(i int) bool { return o.changes[i].start > s })
	return o.changes[i-1].offset
}

// first is the rule: the first moment at which the wall clock reads w (in
// seconds, as if UTC) or later.
func (o offsets) first(w int64) int64 {
	best := int64(math.MaxInt64)
	from := max(sort.Search(len(o.changes), func(i int) bool { return o.changes[i].start > w-day }), 1) - 1
	for i := from; i < len(o.changes) && o.changes[i].start <= w+day; i++ {
		c := o.changes[i]
		end := int64(math.MaxInt64)
		if i+1 < len(o.changes) {
			end = o.changes[i+1].start
		}
		if x := w - c.offset; x >= c.start && x < end {
			best = min(best, x) // a moment that reads w
		}
		if i > 0 && w >= c.start+o.changes[i-1].offset && w < c.start+c.offset {
			best = min(best, c.start) // the clock jumps over w here
		}
	}
	return best
}

// next is the first tick of e after ms by the rule: its matches in the order
// of the wall clock, each at the first moment the clock reads it.
func (o offsets) next(e walked, ms int64) int64 {
	day := time.UnixMilli(ms).UTC().Add(-30 * time.Hour).Truncate(24 * time.Hour)
	for ; day.Before(walkTo.AddDate(0, 0, 400)); day = day.AddDate(0, 0, 1) {
		if !e.date(day.Year(), day.Month(), day.Day(), day.Weekday()) {
			continue
		}
		for _, h := range e.hours {
			for _, m := range e.minutes {
				if x := o.first(day.Unix() + int64(h*3600+m*60)); x*1000 > ms {
					return x * 1000
				}
			}
		}
	}
	return None
}

func TestTheLastDaysOfALeapYearTick(t *testing.T) {
	db, err := zones.Go()
	require.NoError(t, err)
	for _, name := range []string{"Europe/Berlin", "America/New_York", "Australia/Sydney", "America/Santiago"} {
		loc, err := db.Load(name)
		require.NoError(t, err)
		spec, err := Parse(0, "0 3 * * *", loc)
		require.NoError(t, err)
		ms := time.Date(2028, 12, 29, 12, 0, 0, 0, loc).UnixMilli()
		var got []string
		for range 4 {
			ms, err = spec.Next(ms)
			require.NoError(t, err)
			got = append(got, time.UnixMilli(ms).In(loc).Format("01-02 15:04"))
		}
		assert.Equal(t, []string{"12-30 03:00", "12-31 03:00", "01-01 03:00", "01-02 03:00"}, got, name)
	}
}

func TestWildHourTicksInRealTimeInEveryZone(t *testing.T) {
	db, err := zones.Go()
	require.NoError(t, err)
	for _, name := range db.Zones {
		loc, err := db.Load(name)
		require.NoError(t, err)
		spec, err := Parse(0, "*/30 * * * *", loc)
		require.NoError(t, err)
		for _, y := range []int{2028, 2040, 2099} {
			ms := time.Date(y, 12, 30, 12, 0, 0, 0, time.UTC).UnixMilli()
			for range 96 {
				next, err := spec.Next(ms)
				if err != nil || next <= ms || next-ms > 90*60*1000 || time.UnixMilli(next).In(loc).Minute()%30 != 0 {
					t.Fatalf("%s after %v: %v (%v)", name, time.UnixMilli(ms).In(loc), at(next, loc), err)
				}
				ms = next
			}
		}
	}
}

// Both zone databases hold the zones, and say so of one they lack.
func TestZoneDatabasesOpen(t *testing.T) {
	for _, db := range zones.Both(t) {
		assert.Greater(t, len(db.Zones), 300, db.Name)
		assert.True(t, slices.Contains(db.Zones, "Europe/Berlin"), db.Name)
		_, err := db.Load("Europe/Nowhere")
		assert.Error(t, err)
	}
}
