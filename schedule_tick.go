package delayqueue

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/dqueue/delayqueue/internal/tick"
)

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
		at, _ := replyAt(reply, i+2)
		w, e, err := q.advance(name, enc, at, since, now)
		if err != nil {
			// That schedule alone waits: its next look moves on by
			// tickRetry, pushing nothing, while the bucket's jobs and its
			// other schedules go on.
			q.opts.logger.Warn("delayqueue: cannot compute a schedule's next tick; it waits", attrBucket, b, "schedule", name,
				"retry_at", time.UnixMilli(now+tickRetry.Milliseconds()), attrError, err)
			w = scheduleWrite{name: name, def: enc, next: strconv.FormatInt(at, 10), newDef: "=",
				newNext: strconv.FormatInt(now+tickRetry.Milliseconds(), 10)}
			var d scheduleDef
			if json.Unmarshal([]byte(enc), &d) == nil { // else it waits unmarked, and fails again
				d.Retry = true
				if retry, err := json.Marshal(&d); err == nil {
					w.newDef = string(retry)
				}
			}
			e = Event{Kind: EventTickFailed, Topic: d.Topic, Schedule: name, Err: err}
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
		if done[i] && events[i].Kind != 0 {
			q.observe(ctx, events[i])
		}
	}
	return untilMs(head, now), nil
}

// tickRetry is how long a schedule whose next tick cannot be computed
// waits before it is tried again.
const tickRetry = time.Minute

// advance makes the change that fires the schedule named name, stored as
// enc, whose next look is at at, at now: the ticks after since and up to
// the first after now get their jobs; those after at and before since are
// missed. The look is a tick but after a wait (tickRetry, the definition's
// Retry): then ticking resumes after it. It never panics: whatever stops
// the computation is its error.
func (q *DelayQueue) advance(name, enc string, at, since, now int64) (w scheduleWrite, e Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("delayqueue: schedule %q: computing its ticks panicked: %v", name, r)
		}
	}()
	var d scheduleDef
	if err := json.Unmarshal([]byte(enc), &d); err != nil {
		return scheduleWrite{}, Event{}, fmt.Errorf("delayqueue: schedule %q: %w", name, err)
	}
	spec, err := d.spec()
	if err != nil {
		return scheduleWrite{}, Event{}, err
	}
	from := max(at, since-1)
	var ticks []int64
	for t := from; len(ticks) < tick.MaxSteps; {
		if t, err = spec.Next(t); err != nil {
			return scheduleWrite{}, Event{}, fmt.Errorf("delayqueue: schedule %q: %w", name, err)
		}
		if t == tick.None {
			break
		}
		ticks = append(ticks, t)
		if t > now {
			break
		}
	}
	w = scheduleWrite{name: name, def: enc, next: strconv.FormatInt(at, 10), newDef: "="}
	last, came, retried := at, 1, d.Retry
	if retried {
		came, d.Retry = 0, false
		resumed, err := json.Marshal(&d)
		if err != nil {
			return scheduleWrite{}, Event{}, fmt.Errorf("delayqueue: schedule %q: %w", name, err)
		}
		w.newDef = string(resumed)
	}
	for _, t := range ticks {
		if t <= now {
			last, came = t, came+1
		}
	}
	if came > 0 {
		w.last = strconv.FormatInt(last, 10)
	}
	if len(ticks) > 0 {
		w.newNext = strconv.FormatInt(ticks[len(ticks)-1], 10)
	}
	if w.jobs, err = q.tickJobs(name, &d, ticks...); err != nil {
		return scheduleWrite{}, Event{}, err
	}
	if came == 0 {
		return w, Event{}, nil // a wait ended, and no tick came since
	}
	jobID := q.tickID(name, at)
	if retried {
		jobID = q.tickID(name, last)
	}
	e = Event{Kind: EventTick, Topic: d.Topic, JobID: jobID, Schedule: name, Count: came, Missed: spec.Count(at, from)}
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
