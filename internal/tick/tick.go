// Package tick computes when a schedule ticks: Every on a fixed grid, Cron
// in a time zone, with classic cron's rule on the days a clock jumps.
//
// Every ticks at the multiples of its period since the Unix epoch, so that
// "every hour" ticks on the hour (UTC) in every process, and a replaced
// schedule keeps its grid. Cron is read by robfig/cron/v3's standard parser
// (five fields, and descriptors such as @hourly; "@every d" is Every d).
// An expression with a fixed hour is matched against the zone's wall clock
// and each match ticks at the first moment the clock reads that time or
// later: a time of day that a clock skips ticks once, at the jump; one that
// a clock repeats ticks once, the first time. An expression whose hour is
// "*" ticks in real time through the jump.
//
// Every computation is bounded: none walks more than MaxSteps ticks, and
// none asks the time package for a zone's bounds (Time.ZoneBounds), which
// some Go releases get wrong on the last day of a leap year (go.dev/issue/81583).
package tick

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// MaxSteps bounds the ticks one computation walks through: the ticks caught
// up in one look, or counted as missed.
const MaxSteps = 1000

// None is what Next returns when there is no tick to come: a cron that
// matches no date within five years.
const None = -1

// Spec is a schedule's tick rule, parsed. The zero Spec is not valid.
type Spec struct {
	every    int64 // ms; 0 for cron
	cron     *cron.SpecSchedule
	expr     string
	loc      *time.Location
	wildHour bool // the cron's hour field is "*": ticks in real time
}

// Parse reads Every or Cron (exactly one) in loc (nil: UTC); an error says
// what is wrong with them.
func Parse(every time.Duration, expr string, loc *time.Location) (Spec, error) {
	if loc == nil {
		loc = time.UTC
	}
	expr = strings.TrimSpace(expr)
	if d, ok := strings.CutPrefix(expr, "@every "); ok && every == 0 {
		var err error
		if every, err = time.ParseDuration(strings.TrimSpace(d)); err != nil {
			return Spec{}, fmt.Errorf("cron %q: %w", expr, err)
		}
		expr = ""
	}
	switch {
	case every == 0 && expr == "":
		return Spec{}, errors.New("neither Every nor Cron")
	case every != 0 && expr != "":
		return Spec{}, errors.New("both Every and Cron")
	case every < 0 || (every > 0 && every < time.Millisecond):
		return Spec{}, fmt.Errorf("Every %v: want 1ms or more", every)
	case every%time.Millisecond != 0:
		return Spec{}, fmt.Errorf("Every %v: want whole milliseconds", every)
	case every > 0:
		return Spec{every: every.Milliseconds(), loc: loc}, nil
	case strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ="):
		return Spec{}, fmt.Errorf("cron %q: name the time zone in Location", expr)
	}
	parsed, err := cron.ParseStandard(expr)
	if err != nil {
		return Spec{}, fmt.Errorf("cron %q: %w", expr, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return Spec{}, fmt.Errorf("cron %q: not a calendar expression", expr)
	}
	const star = 1 << 63 // the parser's mark of a "*" field
	return Spec{cron: spec, expr: expr, loc: loc, wildHour: spec.Hour&star != 0}, nil
}

// Every is the fixed period in ms; 0 for a cron.
func (s Spec) Every() int64 { return s.every }

// Next returns the first tick after ms (Unix milliseconds), or None. An
// error says the tick could not be computed (a zone whose clock this
// package cannot read around that time, or a cron whose matches all fall
// on one moment for more than MaxSteps matches): no tick is known then.
func (s Spec) Next(ms int64) (int64, error) {
	if s.every > 0 {
		if ms < 0 {
			return 0, nil
		}
		return (ms/s.every + 1) * s.every, nil
	}
	if s.wildHour {
		return s.nextReal(ms)
	}
	// Matches are found on the wall clock (held as UTC, so that the parser
	// knows no jump), in order; the moments they tick at never go back, so
	// the first whose moment is after ms is the tick.
	w := time.UnixMilli(ms + s.offset(floorDiv(ms, 1000))*1000).UTC()
	for range MaxSteps {
		w = s.cron.Next(w)
		if w.IsZero() {
			return None, nil
		}
		at, err := s.at(w.Unix())
		if err != nil {
			return 0, err
		}
		if at*1000 > ms {
			return at * 1000, nil
		}
	}
	return 0, fmt.Errorf("cron %q in %v: more than %d matches fall on moments before %v", s.expr, s.loc, MaxSteps, time.UnixMilli(ms).In(s.loc))
}

// nextReal is Next for an expression whose hour is "*": it ticks at every
// moment whose wall clock reading matches, in real time (twice for a
// reading the clock repeats, never for one it skips). Matches are walked
// on the wall clock from the least reading a moment after ms can show,
// until no later match can be read before the earliest tick found.
func (s Spec) nextReal(ms int64) (int64, error) {
	sec := floorDiv(ms, 1000)
	least := min(s.offset(sec-day), s.offset(sec), s.offset(sec+day))
	w := time.Unix(sec+least-1, 0).UTC()
	best := int64(None)
	for range MaxSteps {
		if w = s.cron.Next(w); w.IsZero() {
			return best, nil
		}
		r := w.Unix()
		offsets := [...]int64{s.offset(r - day), s.offset(r), s.offset(r + day)}
		if best != None && r-max(offsets[0], offsets[1], offsets[2]) >= best/1000 {
			return best, nil
		}
		for _, o := range offsets {
			if x := r - o; s.offset(x) == o && x*1000 > ms && (best == None || x*1000 < best) {
				best = x * 1000
			}
		}
	}
	if best != None {
		return best, nil
	}
	return 0, fmt.Errorf("cron %q in %v: no tick within %d matches after %v", s.expr, s.loc, MaxSteps, time.UnixMilli(ms).In(s.loc))
}

// Count returns how many ticks fall after from and not after to, up to
// MaxSteps; it stops at a tick it cannot compute.
func (s Spec) Count(from, to int64) int {
	if s.every > 0 {
		return int(min(max(to/s.every-from/s.every, 0), MaxSteps))
	}
	n := 0
	for t, err := s.Next(from); err == nil && t != None && t <= to && n < MaxSteps; t, err = s.Next(t) {
		n++
	}
	return n
}

// day bounds the distance between a wall clock reading and the moments
// that show it: offsets from UTC run from -12 h to +14 h.
const day = 24 * 3600

// at returns the first moment (Unix seconds) at which the zone's clock
// reads w (a wall clock reading, in seconds as if it were UTC) or later:
// the moment it reads w, the first of two when the clock repeats w, and
// the jump when the clock skips w.
func (s Spec) at(w int64) (int64, error) {
	before, after := s.offset(w-day), s.offset(w+day)
	if before == after && s.offset(w-before) == before {
		return w - before, nil // no jump near w
	}
	found, first := false, int64(0)
	for _, o := range [...]int64{before, s.offset(w), after} {
		if x := w - o; s.offset(x) == o && (!found || x < first) {
			found, first = true, x
		}
	}
	if found {
		return first, nil
	}
	// No moment reads w: the clock jumps forward over it, from before to
	// after, between lo (which reads less) and hi (which reads more).
	lo, hi := w-after, w-before
	if lo >= hi || lo+s.offset(lo) >= w || hi+s.offset(hi) < w {
		return 0, fmt.Errorf("cron %q: cannot tell when the clock of %v reads %v: more than one change of offset near it", s.expr, s.loc, time.Unix(w, 0).UTC().Format("2006-01-02 15:04:05"))
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if mid+s.offset(mid) >= w {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// offset is the zone's offset from UTC at the moment sec (Unix seconds),
// in seconds.
func (s Spec) offset(sec int64) int64 {
	_, o := time.Unix(sec, 0).In(s.loc).Zone()
	return int64(o)
}

// floorDiv is a / b rounded down.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
