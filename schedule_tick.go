package delayqueue

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// When a schedule ticks. Every ticks at the multiples of its period since
// the Unix epoch, so that "every hour" ticks on the hour (UTC) in every
// process, and a replaced schedule keeps its grid. Cron is read by
// robfig/cron/v3's standard parser (five fields, and descriptors such as
// @hourly; "@every d" is Every d), and evaluated in the schedule's
// Location, with the rule of classic cron on the days its clock jumps: a
// time of day that a clock skips ticks once, at the jump, and one that a
// clock repeats ticks once, the first time; an expression whose hour is
// "*" ticks in real time through the jump.

// tickSpec is a schedule's tick rule, parsed.
type tickSpec struct {
	every    int64 // ms; 0 for cron
	cron     *cron.SpecSchedule
	loc      *time.Location
	wildHour bool // the cron's hour field is "*"
}

// maxTickSteps bounds the ticks one look walks through: ticks caught up
// in one call, or counted as missed.
const maxTickSteps = 1000

// parseSpec reads Every or Cron (exactly one) in loc; errors match
// ErrInvalidSchedule.
func parseSpec(every time.Duration, expr string, loc *time.Location) (tickSpec, error) {
	if loc == nil {
		loc = time.UTC
	}
	expr = strings.TrimSpace(expr)
	if d, ok := strings.CutPrefix(expr, "@every "); ok && every == 0 {
		var err error
		if every, err = time.ParseDuration(strings.TrimSpace(d)); err != nil {
			return tickSpec{}, fmt.Errorf("%w: cron %q: %w", ErrInvalidSchedule, expr, err)
		}
		expr = ""
	}
	switch {
	case every == 0 && expr == "":
		return tickSpec{}, fmt.Errorf("%w: neither Every nor Cron", ErrInvalidSchedule)
	case every != 0 && expr != "":
		return tickSpec{}, fmt.Errorf("%w: both Every and Cron", ErrInvalidSchedule)
	case every < 0 || (every > 0 && every < time.Millisecond):
		return tickSpec{}, fmt.Errorf("%w: Every %v: want 1ms or more", ErrInvalidSchedule, every)
	case every%time.Millisecond != 0:
		return tickSpec{}, fmt.Errorf("%w: Every %v: want whole milliseconds", ErrInvalidSchedule, every)
	case every > 0:
		return tickSpec{every: every.Milliseconds(), loc: loc}, nil
	case strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ="):
		return tickSpec{}, fmt.Errorf("%w: cron %q: name the time zone in Location", ErrInvalidSchedule, expr)
	}
	parsed, err := cron.ParseStandard(expr)
	if err != nil {
		return tickSpec{}, fmt.Errorf("%w: cron %q: %w", ErrInvalidSchedule, expr, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return tickSpec{}, fmt.Errorf("%w: cron %q: not a calendar expression", ErrInvalidSchedule, expr)
	}
	const star = 1 << 63 // the parser's mark of a "*" field
	return tickSpec{cron: spec, loc: loc, wildHour: spec.Hour&star != 0}, nil
}

// next returns the first tick after ms (Unix milliseconds), or -1 when
// there is none (a cron that matches no date within five years).
func (s tickSpec) next(ms int64) int64 {
	if s.every > 0 {
		if ms < 0 {
			return 0
		}
		return (ms/s.every + 1) * s.every
	}
	t := time.UnixMilli(ms).In(s.loc)
	for range maxTickSteps {
		n := s.cron.Next(t)
		if n.IsZero() {
			return -1
		}
		if !s.wildHour {
			if at, ok := s.skipped(t, n); ok {
				return at.UnixMilli()
			}
			if s.repeated(n) {
				t = n
				continue
			}
		}
		return n.UnixMilli()
	}
	return -1
}

// skipped returns the moment a clock jumped forward, after t and not after
// n, when a time of day that the jump skipped matched the cron: that tick
// comes at the jump.
func (s tickSpec) skipped(t, n time.Time) (time.Time, bool) {
	for t.Before(n) {
		_, end := t.ZoneBounds()
		if end.IsZero() || end.After(n) {
			return time.Time{}, false
		}
		_, before := end.Add(-time.Second).Zone()
		_, after := end.Zone()
		if jump := time.Duration(after-before) * time.Second; jump > 0 {
			// On the clock of before the jump, the skipped times of day
			// run from end for jump.
			fixed := time.FixedZone("", before)
			m := s.cron.Next(end.Add(-time.Nanosecond).In(fixed))
			if !m.IsZero() && m.Before(end.Add(jump)) {
				return end, true
			}
		}
		t = end
	}
	return time.Time{}, false
}

// repeated reports whether n's time of day came once already, before a
// clock went back.
func (s tickSpec) repeated(n time.Time) bool {
	start, _ := n.ZoneBounds()
	if start.IsZero() {
		return false
	}
	_, before := start.Add(-time.Second).Zone()
	_, after := n.Zone()
	back := time.Duration(before-after) * time.Second
	return back > 0 && n.Sub(start) < back
}

// count returns how many ticks fall after from and not after to, up to
// maxTickSteps.
func (s tickSpec) count(from, to int64) int {
	if s.every > 0 {
		return int(min(max(to/s.every-from/s.every, 0), maxTickSteps))
	}
	n := 0
	for t := s.next(from); t >= 0 && t <= to && n < maxTickSteps; t = s.next(t) {
		n++
	}
	return n
}

// maxDueSchedules bounds the schedules one look at a bucket fires.
const maxDueSchedules = 100

// fireTicks fires the schedules of bucket b whose next tick came: for each,
// it pushes the jobs of the ticks after it, up to the first one to come
// (pushed ahead of its time), and advances the schedule. The ticks that
// came while started processes watched the bucket (move.lua keeps since
// when, in Redis: a takeover was late, whichever process took over) are
// caught up, a job each; those before came while no started process
// reached Redis for twice its lease (an outage) and are skipped: the first
// one's job was pushed ahead already. It returns how long until the
// bucket's next tick; -1 when it has none.
func (q *DelayQueue) fireTicks(ctx context.Context, b int) (time.Duration, error) {
	bk := q.keys.bucket(b)
	reply, err := q.run(ctx, b, scriptTicks, []string{bk.ticks, bk.schedules, bk.watched}, maxDueSchedules).Slice()
	if err != nil {
		return 0, fmt.Errorf("delayqueue: look at the schedules of bucket %d: %w", b, err)
	}
	now, ok := replyAt(reply, 0)
	head, ok2 := replyAt(reply, 1)
	since, ok3 := replyAt(reply, 2)
	if !ok || !ok2 || !ok3 || len(reply)%3 != 0 {
		return 0, fmt.Errorf("delayqueue: look at the schedules of bucket %d: unexpected reply %v", b, reply)
	}
	var ws []scheduleWrite
	var events []Event
	for i := 3; i+2 < len(reply); i += 3 {
		name, _ := reply[i].(string)
		enc, _ := reply[i+1].(string)
		tick, _ := replyAt(reply, i+2)
		w, e, err := q.advance(name, enc, tick, since, now)
		if err != nil {
			q.opts.logger.Warn("delayqueue: cannot fire a schedule", attrBucket, b, "schedule", name, attrError, err)
			continue
		}
		ws, events = append(ws, w), append(events, e)
	}
	if len(ws) == 0 {
		return untilMs(head, now), nil
	}
	done, err := q.writeSchedules(ctx, b, false, ws)
	if err != nil {
		return 0, fmt.Errorf("delayqueue: fire the schedules of bucket %d: %w", b, err)
	}
	for i, w := range ws {
		if next, err := strconv.ParseInt(w.newNext, 10, 64); err == nil && (head < 0 || next < head) {
			head = next
		}
		if done[i] {
			q.observe(ctx, events[i])
		}
	}
	return untilMs(head, now), nil
}

// advance makes the change that fires the schedule named name, stored as
// enc, whose next tick is tick, at now: the ticks after since and up to
// the first after now get their jobs; those after tick and before since are
// missed.
func (q *DelayQueue) advance(name, enc string, tick, since, now int64) (scheduleWrite, Event, error) {
	var d scheduleDef
	if err := json.Unmarshal([]byte(enc), &d); err != nil {
		return scheduleWrite{}, Event{}, err
	}
	spec, err := d.spec()
	if err != nil {
		return scheduleWrite{}, Event{}, err
	}
	from := max(tick, since-1)
	var ticks []int64
	for t := spec.next(from); t >= 0 && len(ticks) < maxTickSteps; t = spec.next(t) {
		ticks = append(ticks, t)
		if t > now {
			break
		}
	}
	w := scheduleWrite{name: name, def: enc, next: strconv.FormatInt(tick, 10), newDef: "="}
	last, came := tick, 1
	for _, t := range ticks {
		if t <= now {
			last, came = t, came+1
		}
	}
	w.last = strconv.FormatInt(last, 10)
	if len(ticks) > 0 {
		w.newNext = strconv.FormatInt(ticks[len(ticks)-1], 10)
	}
	if w.jobs, err = q.tickJobs(name, &d, ticks...); err != nil {
		return scheduleWrite{}, Event{}, err
	}
	e := Event{Kind: EventTick, Topic: d.Topic, JobID: q.tickID(name, tick), Schedule: name, Count: came, Missed: spec.count(tick, from)}
	return w, e, nil
}

// replyAt reads the integer at i of a script's reply.
func replyAt(reply []any, i int) (int64, bool) {
	if i >= len(reply) {
		return 0, false
	}
	n, ok := reply[i].(int64)
	return n, ok
}

// untilMs is how long from now until at (ms); -1 when at is -1.
func untilMs(at, now int64) time.Duration {
	if at < 0 {
		return -1
	}
	return time.Duration(max(at-now, 0)) * time.Millisecond
}
