package delayqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dqueue/delayqueue/internal/tick"
	"github.com/redis/go-redis/v9"
)

// Periodic schedules. A schedule is data in Redis, in the bucket its name
// falls in (dq:{name:b}:schedules, :ticks, :lastticks), so any started
// process fires it and it outlives every process. Its next tick's job is
// always pushed already, as a delayed job due at the tick: it becomes ready
// on time as any delayed job does. When that tick comes, the bucket's
// holder pushes the job of the tick after it and advances the schedule, in
// one compare-and-set script (schedule.lua) over the bucket: the jobs of a
// schedule are in its own bucket, as their IDs are chosen to be, so a tick
// is pushed once however many processes look at it.

// Schedule is a periodic job: every tick of Every or Cron pushes Job, with
// RunAt the tick's time and an ID naming the schedule and the tick
// ("<Name>@<tick in UTC, RFC 3339 with milliseconds>", and "~<n>" when the
// queue needs it to keep the job in the schedule's bucket).
type Schedule struct {
	// Name identifies the schedule: 1 to 100 bytes of printable UTF-8
	// with no spaces, '{' or '}', not beginning with '~'.
	Name string
	// Every ticks at the multiples of this period since the Unix epoch
	// (so every hour ticks on the hour, UTC): 1ms or more, in whole
	// milliseconds.
	Every time.Duration
	// Cron ticks at the times a standard 5-field cron expression names
	// (or a descriptor: @hourly, @daily, @weekly, @monthly, @yearly;
	// "@every 90s" is Every), in Location.
	Cron string
	// Location is the time zone of Cron; nil is UTC. It must be one that
	// time.LoadLocation finds by name in every process (not time.Local),
	// and that zone itself: only its name is stored, so a zone of its own
	// under a zone's name (time.FixedZone("UTC", 3600)) is refused.
	Location *time.Location
	// Job is what each tick pushes: Topic, Body, TTR, MaxAttempts,
	// Headers, DedupWindow. Its ID, Delay and RunAt come from the tick.
	Job Job
	// Paused: a paused schedule pushes nothing until resumed. Schedule
	// creates it paused when set; Schedules reports it.
	Paused bool
	// Next is the next tick, whose job is pushed already; zero while
	// paused. While the schedule's ticks cannot be computed
	// (EventTickFailed), it is when they are tried again, and no job is
	// pushed. Read back by Schedules.
	Next time.Time
	// Last is the latest tick that came; zero before the first. Read back
	// by Schedules.
	Last time.Time
}

const maxScheduleName = 100

// scheduleDef is a schedule as stored (the value in dq:{name:b}:schedules).
type scheduleDef struct {
	Every    int64             `json:"every_ms,omitempty"`
	Cron     string            `json:"cron,omitempty"`
	Location string            `json:"loc,omitempty"`
	Paused   bool              `json:"paused,omitempty"`
	Topic    string            `json:"topic"`
	Body     []byte            `json:"body,omitempty"`
	TTR      int64             `json:"ttr_ms,omitempty"`
	Attempts int               `json:"max_attempts,omitempty"`
	Dedup    int64             `json:"dedup_ms,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	// Retry: the schedule's next look is a retry after a tick that could
	// not be computed (schedule_tick.go), not a tick.
	Retry bool `json:"retry,omitempty"`
}

// Schedule creates the schedule named s.Name, or replaces it: its next
// tick's job is pushed at once, due at that tick (a replaced schedule's
// pending job is taken back), and the schedule fires in any process that
// has called Start. It returns an error matching ErrInvalidSchedule (and
// ErrInvalidJob for a bad Job) for a schedule it refuses, writing nothing.
func (q *DelayQueue) Schedule(ctx context.Context, s Schedule) error {
	if q.closed.Load() {
		return ErrClosed
	}
	def, spec, err := q.checkSchedule(s)
	if err != nil {
		return err
	}
	return q.changeSchedule(ctx, s.Name, func(cur *scheduleDef) (*scheduleDef, tick.Spec, error) {
		return def, spec, nil
	})
}

// Unschedule deletes the schedule named name, and its next tick's job if
// it is not due yet. It returns ErrNotFound when there is none.
func (q *DelayQueue) Unschedule(ctx context.Context, name string) error {
	return q.changeExisting(ctx, name, func(*scheduleDef) *scheduleDef { return nil })
}

// PauseSchedule stops the schedule named name from pushing jobs, and takes
// back its next tick's job if it is not due yet; pausing a paused schedule
// changes nothing. It returns ErrNotFound when there is none. To hold the
// jobs of its topic instead, Pause the topic.
func (q *DelayQueue) PauseSchedule(ctx context.Context, name string) error {
	return q.changeExisting(ctx, name, func(d *scheduleDef) *scheduleDef { d.Paused = true; return d })
}

// ResumeSchedule has a paused schedule tick again, from its first tick
// after now. It returns ErrNotFound when there is none.
func (q *DelayQueue) ResumeSchedule(ctx context.Context, name string) error {
	return q.changeExisting(ctx, name, func(d *scheduleDef) *scheduleDef { d.Paused = false; return d })
}

// changeExisting changes the stored schedule named name with change (nil:
// delete it).
func (q *DelayQueue) changeExisting(ctx context.Context, name string, change func(*scheduleDef) *scheduleDef) error {
	if q.closed.Load() {
		return ErrClosed
	}
	if err := validateScheduleName(name); err != nil {
		return err
	}
	return q.changeSchedule(ctx, name, func(cur *scheduleDef) (*scheduleDef, tick.Spec, error) {
		if cur == nil {
			return nil, tick.Spec{}, fmt.Errorf("%w: no schedule %q", ErrNotFound, name)
		}
		def := change(cur)
		if def == nil {
			return nil, tick.Spec{}, nil
		}
		spec, err := def.spec()
		return def, spec, err
	})
}

// maxScheduleTries bounds how often a change is tried again when the
// schedule changed between its read and its write.
const maxScheduleTries = 20

// changeSchedule reads the schedule named name, has change say what it
// becomes (nil: deleted), and writes that with schedule.lua, reading again
// when it changed meanwhile.
func (q *DelayQueue) changeSchedule(ctx context.Context, name string, change func(cur *scheduleDef) (*scheduleDef, tick.Spec, error)) error {
	b := bucketOf(name, q.opts.buckets)
	bk := q.keys.bucket(b)
	for range maxScheduleTries {
		pipe := q.client.Pipeline()
		defCmd, nextCmd := pipe.HGet(ctx, bk.schedules, name), pipe.ZScore(ctx, bk.ticks, name)
		clock := pipe.Time(ctx) // ticks are told from the server's clock, as due times are
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			q.noteError(ctx, err)
			return fmt.Errorf("delayqueue: read schedule %q: %w", name, err)
		}
		read, nextRead := defCmd.Val(), ""
		var cur *scheduleDef
		if read != "" {
			cur = &scheduleDef{}
			if err := json.Unmarshal([]byte(read), cur); err != nil {
				return fmt.Errorf("delayqueue: read schedule %q: %w", name, err)
			}
		}
		if nextCmd.Err() == nil {
			nextRead = strconv.FormatInt(int64(nextCmd.Val()), 10)
		}
		def, spec, err := change(cur)
		if err != nil {
			return err
		}
		w := scheduleWrite{name: name, def: read, next: nextRead}
		if nextRead != "" {
			ms, _ := strconv.ParseInt(nextRead, 10, 64)
			w.takeBack = q.tickID(name, ms)
		}
		if def != nil {
			def.Retry = false // its next tick is computed here
			enc, err := json.Marshal(def)
			if err != nil {
				return fmt.Errorf("delayqueue: schedule %q: %w", name, err)
			}
			w.newDef = string(enc)
			if !def.Paused {
				first, err := spec.Next(clock.Val().UnixMilli())
				if err != nil {
					return fmt.Errorf("%w: %q: %w", ErrInvalidSchedule, name, err)
				}
				if first == tick.None {
					return fmt.Errorf("%w: %q never ticks", ErrInvalidSchedule, name)
				}
				if w.jobs, err = q.tickJobs(name, def, first); err != nil {
					return err
				}
				w.newNext = strconv.FormatInt(first, 10)
			}
		}
		done, err := q.writeSchedules(ctx, b, true, []scheduleWrite{w})
		if err != nil {
			return fmt.Errorf("delayqueue: schedule %q: %w", name, err)
		}
		if done[0] {
			return nil
		}
	}
	return fmt.Errorf("delayqueue: schedule %q: changed by others %d times while this call tried", name, maxScheduleTries)
}

// scheduleWrite is one schedule's change for schedule.lua.
type scheduleWrite struct {
	name, def, next string // as read
	newDef          string // "" deletes; "=" keeps
	newNext, last   string // "" none; "" keeps
	takeBack        string
	jobs            []pushArgs
}

// writeSchedules runs schedule.lua over bucket b, and says of each change
// whether it was made.
func (q *DelayQueue) writeSchedules(ctx context.Context, b int, announce bool, ws []scheduleWrite) ([]bool, error) {
	bk := q.keys.bucket(b)
	args := []any{bk.wake, q.pub, announce}
	for _, w := range ws {
		args = append(args, w.name, w.def, w.next, w.newDef, w.newNext, w.last, w.takeBack, len(w.jobs))
		for _, j := range w.jobs {
			args = append(args, j.id, j.job)
		}
	}
	res, err := q.run(ctx, b, scriptSchedule, []string{bk.schedules, bk.ticks, bk.lastTicks, bk.pool, bk.zset, bk.counts}, args...).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != len(ws) {
		return nil, fmt.Errorf("%d replies for %d schedules", len(res), len(ws))
	}
	done := make([]bool, len(res))
	for i, r := range res {
		done[i] = r == scheduleChanged
	}
	return done, nil
}

// Schedules lists every schedule, by name, with its next and last tick and
// whether it is paused.
func (q *DelayQueue) Schedules(ctx context.Context) ([]Schedule, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	pipe := q.client.Pipeline()
	defs := make([]*redis.MapStringStringCmd, q.opts.buckets)
	nexts := make([]*redis.ZSliceCmd, q.opts.buckets)
	lasts := make([]*redis.MapStringStringCmd, q.opts.buckets)
	for b := range defs {
		bk := q.keys.bucket(b)
		defs[b], nexts[b], lasts[b] = pipe.HGetAll(ctx, bk.schedules), pipe.ZRangeWithScores(ctx, bk.ticks, 0, -1), pipe.HGetAll(ctx, bk.lastTicks)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		q.noteError(ctx, err)
		return nil, fmt.Errorf("delayqueue: schedules: %w", err)
	}
	var out []Schedule
	for b := range defs {
		next := map[string]int64{}
		for _, z := range nexts[b].Val() {
			next[z.Member.(string)] = int64(z.Score)
		}
		for name, enc := range defs[b].Val() {
			var d scheduleDef
			if err := json.Unmarshal([]byte(enc), &d); err != nil {
				return nil, fmt.Errorf("delayqueue: schedule %q: %w", name, err)
			}
			s := d.schedule(name)
			if ms, ok := next[name]; ok {
				s.Next = time.UnixMilli(ms)
			}
			if ms, err := strconv.ParseInt(lasts[b].Val()[name], 10, 64); err == nil {
				s.Last = time.UnixMilli(ms)
			}
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Schedule) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// checkSchedule validates s and returns what is stored of it.
func (q *DelayQueue) checkSchedule(s Schedule) (*scheduleDef, tick.Spec, error) {
	if err := validateScheduleName(s.Name); err != nil {
		return nil, tick.Spec{}, err
	}
	// Checked here, where a schedule is made, and not where one is named:
	// one made before this check can still be paused and unscheduled.
	if !utf8.ValidString(s.Name) {
		return nil, tick.Spec{}, fmt.Errorf("%w: Name %q is not UTF-8", ErrInvalidSchedule, s.Name)
	}
	loc, zone := "UTC", s.Location
	if s.Location != nil {
		loc = s.Location.String()
		if s.Location == time.Local || loc == "Local" {
			return nil, tick.Spec{}, fmt.Errorf("%w: Location Local differs by process: name a zone (time.LoadLocation)", ErrInvalidSchedule)
		}
		var err error
		if zone, err = loadLocation(loc); err != nil {
			return nil, tick.Spec{}, fmt.Errorf("%w: Location %q: %w", ErrInvalidSchedule, loc, err)
		}
		// Only the name is stored, and every process ticks by the zone
		// it names: a zone of its own under that name would tick
		// elsewhere (time.FixedZone("UTC", 5*3600), say).
		if !sameZone(s.Location, zone) {
			return nil, tick.Spec{}, fmt.Errorf("%w: Location %q is not the zone of that name (time.LoadLocation)", ErrInvalidSchedule, loc)
		}
	}
	spec, err := tick.Parse(s.Every, s.Cron, zone)
	if err != nil {
		return nil, tick.Spec{}, fmt.Errorf("%w: %w", ErrInvalidSchedule, err)
	}
	// Paused or not: a schedule that could never tick is refused now, not
	// when it is resumed.
	switch next, err := spec.Next(time.Now().UnixMilli()); {
	case err != nil:
		return nil, tick.Spec{}, fmt.Errorf("%w: %q: %w", ErrInvalidSchedule, s.Name, err)
	case next == tick.None:
		return nil, tick.Spec{}, fmt.Errorf("%w: %q never ticks", ErrInvalidSchedule, s.Name)
	}
	j := s.Job
	switch {
	case j.ID != "" || j.Delay != 0 || !j.RunAt.IsZero():
		return nil, tick.Spec{}, within(ErrInvalidSchedule, fmt.Errorf("%w: a schedule's Job takes its ID and due time from its ticks", ErrInvalidJob))
	}
	// The job as a tick would push it, checked as Push checks a job before
	// its durations are stored in whole milliseconds: refused now, not at
	// every tick.
	now := time.Now().UnixMilli()
	if _, err := q.opts.prepare(&Job{ID: q.tickID(s.Name, now), Topic: j.Topic, Body: j.Body, Headers: j.Headers,
		RunAt: time.UnixMilli(now), TTR: j.TTR, MaxAttempts: j.MaxAttempts, DedupWindow: j.DedupWindow}); err != nil {
		return nil, tick.Spec{}, within(ErrInvalidSchedule, err)
	}
	def := &scheduleDef{Every: s.Every.Milliseconds(), Cron: strings.TrimSpace(s.Cron), Location: loc, Paused: s.Paused,
		Topic: j.Topic, Body: j.Body, TTR: ceilMs(j.TTR), Attempts: j.MaxAttempts, Dedup: ceilMs(j.DedupWindow), Headers: j.Headers}
	if def.Location == "UTC" {
		def.Location = ""
	}
	return def, spec, nil
}

// sameZone reports whether a and b give the same offsets from UTC over the
// coming two years, sampled every week.
func sameZone(a, b *time.Location) bool {
	t := time.Now()
	for range 105 {
		_, x := t.In(a).Zone()
		_, y := t.In(b).Zone()
		if x != y {
			return false
		}
		t = t.Add(7 * 24 * time.Hour)
	}
	return true
}

// validateScheduleName accepts what validateTopic does, up to 100 bytes,
// not beginning with "~".
func validateScheduleName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: no Name", ErrInvalidSchedule)
	case len(name) > maxScheduleName:
		return fmt.Errorf("%w: Name of %d bytes, limit %d", ErrInvalidSchedule, len(name), maxScheduleName)
	case strings.HasPrefix(name, generatedMark):
		return fmt.Errorf("%w: Name %q begins with %q", ErrInvalidSchedule, name, generatedMark)
	}
	for _, r := range name {
		if r == '{' || r == '}' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: Name %q holds %q", ErrInvalidSchedule, name, r)
		}
	}
	return nil
}

// spec parses a stored schedule's tick rule.
func (d *scheduleDef) spec() (tick.Spec, error) {
	loc, err := d.location()
	if err != nil {
		return tick.Spec{}, err
	}
	spec, err := tick.Parse(time.Duration(d.Every)*time.Millisecond, d.Cron, loc)
	if err != nil {
		return tick.Spec{}, fmt.Errorf("delayqueue: stored schedule: %w", err)
	}
	return spec, nil
}

func (d *scheduleDef) location() (*time.Location, error) {
	if d.Location == "" {
		return time.UTC, nil
	}
	loc, err := loadLocation(d.Location)
	if err != nil {
		return nil, fmt.Errorf("delayqueue: schedule's Location %q: %w", d.Location, err)
	}
	return loc, nil
}

// loadLocation finds a time zone by name, as every process does for the
// schedules it fires: time.LoadLocation (tests choose the zone database).
var loadLocation = time.LoadLocation

// schedule is the Schedule d stores, without its ticks.
func (d *scheduleDef) schedule(name string) Schedule {
	s := Schedule{Name: name, Every: time.Duration(d.Every) * time.Millisecond, Cron: d.Cron, Paused: d.Paused,
		Job: Job{Topic: d.Topic, Body: d.Body, TTR: time.Duration(d.TTR) * time.Millisecond, MaxAttempts: d.Attempts,
			DedupWindow: time.Duration(d.Dedup) * time.Millisecond, Headers: d.Headers}}
	s.Location, _ = d.location()
	return s
}

// tickJobs prepares the jobs of the ticks at ms..., each due at its tick.
func (q *DelayQueue) tickJobs(name string, d *scheduleDef, ms ...int64) ([]pushArgs, error) {
	out := make([]pushArgs, len(ms))
	for i, t := range ms {
		job := &Job{ID: q.tickID(name, t), Topic: d.Topic, Body: d.Body, Headers: d.Headers, RunAt: time.UnixMilli(t),
			TTR: time.Duration(d.TTR) * time.Millisecond, MaxAttempts: d.Attempts, DedupWindow: time.Duration(d.Dedup) * time.Millisecond}
		a, err := q.opts.prepare(job)
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// tickID is the ID of the job of the schedule named name's tick at ms:
// the name and the tick, and "~<n>" with the least n that puts it in the
// schedule's bucket, when it needs one.
func (q *DelayQueue) tickID(name string, ms int64) string {
	base := name + "@" + time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
	b, n := bucketOf(name, q.opts.buckets), q.opts.buckets
	id := base
	for k := 1; bucketOf(id, n) != b; k++ {
		id = base + "~" + strconv.Itoa(k)
	}
	return id
}
