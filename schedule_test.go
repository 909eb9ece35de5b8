package delayqueue

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tickRecorder collects EventTick events.
type tickRecorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *tickRecorder) Observe(_ context.Context, e Event) {
	if e.Kind == EventTick {
		r.mu.Lock()
		r.events = append(r.events, e)
		r.mu.Unlock()
	}
}

func (r *tickRecorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func TestScheduleFiresEachTickOnceAheadOfItsTime(t *testing.T) {
	ctx := context.Background()
	rec := &tickRecorder{}
	q, _, c, advance := clockQueue(t, WithObserver(rec))
	other := newQueue(t, c, WithName(q.opts.name)) // a second process
	start := time.UnixMilli(1_700_000_000_000)
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "digest", Every: time.Second, Job: Job{Topic: "t", Body: []byte("b")}}))

	// The first tick's job is pushed at once, due at the tick.
	first := start.Truncate(time.Second).Add(time.Second)
	job, err := q.Get(ctx, q.tickID("digest", first.UnixMilli()))
	require.NoError(t, err)
	assert.Equal(t, "digest@2023-11-14T22:13:21.000Z", job.ID)
	assert.Equal(t, StateDelayed, job.State)
	assert.True(t, first.Equal(job.RunAt), "due at its tick: %v", job.RunAt)

	// Nothing fires before the tick.
	_, err = q.fireTicks(ctx, 0)
	require.NoError(t, err)
	_, err = q.Get(ctx, q.tickID("digest", first.Add(time.Second).UnixMilli()))
	require.ErrorIs(t, err, ErrNotFound)

	// At the tick, its job moves as any delayed job, and the next tick's
	// job is pushed; two processes that fire it push it once.
	advance(first.Sub(start))
	_, err = q.moveDue(ctx, 0, "tok", false)
	require.NoError(t, err)
	until, err := q.fireTicks(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, time.Second, until)
	until, err = other.fireTicks(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, time.Second, until, "the second look finds the tick fired")
	st, err := readKeyStats(ctx, q, "t")
	require.NoError(t, err)
	assert.Equal(t, 1, st.Ready)
	assert.Equal(t, 1, st.Scheduled, "the next tick's job, and no other")
	require.Len(t, rec.all(), 1)
	assert.Equal(t, Event{Kind: EventTick, Topic: "t", JobID: q.tickID("digest", first.UnixMilli()), Schedule: "digest", Count: 1}, rec.all()[0])

	popped, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	assert.Equal(t, job.ID, popped.ID)
	assert.True(t, first.Equal(popped.RunAt), "a popped tick's job carries its tick: %v", popped.RunAt)
	assert.Equal(t, []byte("b"), popped.Body)

	list, err := q.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.True(t, first.Add(time.Second).Equal(list[0].Next), "next %v", list[0].Next)
	assert.True(t, first.Equal(list[0].Last), "last %v", list[0].Last)
	assert.Equal(t, time.Second, list[0].Every)
	assert.Equal(t, "t", list[0].Job.Topic)
}

func TestScheduleAfterAnOutagePushesOneJobForTheTicksMissed(t *testing.T) {
	ctx := context.Background()
	rec := &tickRecorder{}
	q, _, _, advance := clockQueue(t, WithObserver(rec))
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "s", Every: time.Minute, Job: Job{Topic: "t"}}))

	// Nobody fired it for an hour: the first missed tick's job (pushed
	// ahead) is the one catch-up job; ticking resumes after now.
	advance(time.Hour)
	_, err := q.moveDue(ctx, 0, "tok", false)
	require.NoError(t, err)
	_, err = q.fireTicks(ctx, 0) // the first look after the outage
	require.NoError(t, err)
	st, err := readKeyStats(ctx, q, "t")
	require.NoError(t, err)
	assert.Equal(t, 1, st.Ready, "one catch-up job")
	assert.Equal(t, 1, st.Scheduled, "the next tick's")
	require.Len(t, rec.all(), 1)
	assert.Equal(t, 59, rec.all()[0].Missed)

	// Ticks that came while started processes watched the bucket (a slow
	// takeover) are each pushed, late, in order.
	for range 3 {
		advance(time.Minute)
		_, err = q.moveDue(ctx, 0, "another process", false)
		require.NoError(t, err)
	}
	_, err = q.fireTicks(ctx, 0)
	require.NoError(t, err)
	st, err = readKeyStats(ctx, q, "t")
	require.NoError(t, err)
	assert.Equal(t, 1+3, st.Ready+st.Scheduled-1, "three ticks came: each has its job")
	assert.Equal(t, 0, rec.all()[1].Missed)
	assert.Equal(t, 3, rec.all()[1].Count)
}

// TestScheduleTakeoverByAProcessStartedInTheGap: the holder and both
// standbys die; a process that started after them takes the bucket over
// while an older one, without a lease, watched throughout. That is a late
// takeover, not an outage: every tick of the gap gets its job.
func TestScheduleTakeoverByAProcessStartedInTheGap(t *testing.T) {
	ctx := context.Background()
	rec := &tickRecorder{}
	q, m, c, advance := clockQueue(t, WithLease(time.Minute))
	passes := func(d time.Duration) { advance(d); m.FastForward(d) } // the clock, and the leases' expiry
	process := func(opts ...Option) *bucketHandler {
		return newBucketHandler(newQueue(t, c, append([]Option{WithName(q.opts.name), WithBuckets(1), WithLease(time.Minute)}, opts...)...), 0)
	}
	holder, standby, second, older := process(), process(), process(), process()
	for _, h := range []*bucketHandler{holder, standby, second, older} {
		h.step(ctx)
	}
	require.Equal(t, []leaseRole{roleHolder, roleStandby, roleSecond, roleNone},
		[]leaseRole{holder.lease.role, standby.lease.role, second.lease.role, older.lease.role})
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "s", Every: 10 * time.Second, Job: Job{Topic: "t"}}))

	// The holder and both standbys are killed: they look no more. The
	// older process looks when a standby lease would run out, still held.
	passes(40 * time.Second)
	older.step(ctx)
	require.Equal(t, roleNone, older.lease.role)
	passes(40 * time.Second) // the three leases ran out
	fresh := process(WithObserver(rec))
	fresh.step(ctx)
	require.Equal(t, roleHolder, fresh.lease.role, "the new process took the bucket over")

	st, err := readKeyStats(ctx, q, "t")
	require.NoError(t, err)
	assert.Equal(t, 8, st.Ready+st.Scheduled-1, "the 8 ticks of the 80s gap, a job each, and the next tick's")
	require.Len(t, rec.all(), 1)
	assert.Equal(t, 0, rec.all()[0].Missed)
	assert.Equal(t, 8, rec.all()[0].Count)
}

func TestScheduleRefusesBadInputAndWritesNothing(t *testing.T) {
	ctx := context.Background()
	q, _, c, _ := clockQueue(t)
	before := keysOf(t, c)
	job := Job{Topic: "t"}
	for name, s := range map[string]Schedule{
		"no name":        {Every: time.Second, Job: job},
		"bad name":       {Name: "a b", Every: time.Second, Job: job},
		"braces":         {Name: "{a}", Every: time.Second, Job: job},
		"neither":        {Name: "n", Job: job},
		"both":           {Name: "n", Every: time.Second, Cron: "* * * * *", Job: job},
		"zero every":     {Name: "n", Every: 0, Job: job},
		"negative every": {Name: "n", Every: -time.Second, Job: job},
		"sub-ms every":   {Name: "n", Every: time.Microsecond, Job: job},
		"bad cron":       {Name: "n", Cron: "61 * * * *", Job: job},
		"never":          {Name: "n", Cron: "0 0 30 2 *", Job: job},
		"cron tz":        {Name: "n", Cron: "CRON_TZ=UTC 0 8 * * *", Job: job},
		"local":          {Name: "n", Cron: "0 8 * * *", Location: time.Local, Job: job},
		"never, paused":  {Name: "n", Cron: "0 0 30 2 *", Paused: true, Job: job},
		"not UTF-8":      {Name: "a\xffb", Every: time.Second, Job: job},
		"unnamed zone":   {Name: "n", Cron: "0 8 * * *", Location: time.FixedZone("", 8*3600), Job: job},
		"zone misnamed":  {Name: "n", Cron: "0 8 * * *", Location: time.FixedZone("UTC", 5*3600), Job: job},
		"zone renamed":   {Name: "n", Cron: "0 8 * * *", Location: time.FixedZone("Europe/Berlin", 5*3600), Job: job},
	} {
		err := q.Schedule(ctx, s)
		assert.ErrorIs(t, err, ErrInvalidSchedule, name)
	}
	for name, j := range map[string]Job{
		"no topic":  {},
		"bad topic": {Topic: "a{b}"},
		"an ID":     {Topic: "t", ID: "x"},
		"a delay":   {Topic: "t", Delay: time.Second},
		"big body":  {Topic: "t", Body: make([]byte, 2<<20)},
		// Refused as Push refuses them, not rounded to whole milliseconds.
		"TTR -1ns":             {Topic: "t", TTR: -time.Nanosecond},
		"TTR 1ns":              {Topic: "t", TTR: time.Nanosecond},
		"DedupWindow -1ns":     {Topic: "t", DedupWindow: -time.Nanosecond},
		"MaxAttempts too many": {Topic: "t", MaxAttempts: maxMaxAttempts + 1},
	} {
		err := q.Schedule(ctx, Schedule{Name: "n", Every: time.Second, Job: j})
		assert.ErrorIs(t, err, ErrInvalidSchedule, name)
		assert.ErrorIs(t, err, ErrInvalidJob, name)
	}
	assert.Equal(t, before, keysOf(t, c))
	assert.ErrorIs(t, q.Unschedule(ctx, "none"), ErrNotFound)
	assert.ErrorIs(t, q.PauseSchedule(ctx, "none"), ErrNotFound)

	// A zone is its name's: one loaded by it, or one that keeps its offsets.
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "berlin", Cron: "0 8 * * *", Location: berlin, Job: job}))
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "utc", Cron: "0 8 * * *", Location: time.FixedZone("UTC", 0), Job: job}))
}

func TestSchedulePauseResumeReplaceUnschedule(t *testing.T) {
	ctx := context.Background()
	q, _, _, _ := clockQueue(t)
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "s", Every: time.Minute, Job: Job{Topic: "t"}}))
	delayed := func() int {
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		return st.Scheduled
	}
	require.Equal(t, 1, delayed())

	require.NoError(t, q.PauseSchedule(ctx, "s"))
	assert.Equal(t, 0, delayed(), "the pending tick's job is taken back")
	list, err := q.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.True(t, list[0].Paused)
	assert.True(t, list[0].Next.IsZero())
	require.NoError(t, q.PauseSchedule(ctx, "s"))

	require.NoError(t, q.ResumeSchedule(ctx, "s"))
	assert.Equal(t, 1, delayed())

	// Replacing keeps one pending job, of the new definition.
	require.NoError(t, q.Schedule(ctx, Schedule{Name: "s", Every: time.Minute, Job: Job{Topic: "t", Body: []byte("v2")}}))
	assert.Equal(t, 1, delayed())
	list, err = q.Schedules(ctx)
	require.NoError(t, err)
	job, err := q.Get(ctx, q.tickID("s", list[0].Next.UnixMilli()))
	require.NoError(t, err)
	assert.Equal(t, []byte("v2"), job.Body)

	require.NoError(t, q.Unschedule(ctx, "s"))
	assert.Equal(t, 0, delayed())
	list, err = q.Schedules(ctx)
	require.NoError(t, err)
	assert.Empty(t, list)
	assert.ErrorIs(t, q.Unschedule(ctx, "s"), ErrNotFound)
}

func TestScheduleTicksInStartedProcesses(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		admin := newQueue(t, be.client, WithName(name)) // never started
		worker := newQueue(t, be.client, WithName(name))
		startQueue(t, worker) // before the first tick: no tick comes while none runs
		names := []string{"a", "b", "c", "d", "e", "f"}
		buckets := map[int]bool{}
		for _, n := range names {
			buckets[bucketOf(n, admin.opts.buckets)] = true
			require.NoError(t, admin.Schedule(ctx, Schedule{Name: n, Every: 50 * time.Millisecond, Job: Job{Topic: "tick"}}))
		}
		if admin.opts.buckets > 1 {
			assert.Greater(t, len(buckets), 1, "schedules spread over buckets")
		}
		seen := map[string]map[int64]bool{}
		require.Eventually(t, func() bool {
			job, err := worker.Pop(ctx, "tick", 10*time.Millisecond)
			if err != nil {
				return false
			}
			require.NoError(t, worker.Finish(ctx, job.ID))
			s, _, _ := cutLast(job.ID, "@")
			tick := job.RunAt.UnixMilli()
			require.Equal(t, worker.tickID(s, tick), job.ID)
			require.Zero(t, tick%50, "on the grid")
			if seen[s] == nil {
				seen[s] = map[int64]bool{}
			}
			require.False(t, seen[s][tick], "tick %s pushed twice", job.ID)
			seen[s][tick] = true
			for _, n := range names {
				if len(seen[n]) < 5 {
					return false
				}
			}
			return true
		}, 30*time.Second, time.Millisecond)
		for _, n := range names {
			assertConsecutive(t, seen[n], 50)
		}
	})
}

// assertConsecutive checks that the ticks seen, but for the last few,
// follow one another on a grid of every ms: none skipped.
func assertConsecutive(t *testing.T, ticks map[int64]bool, every int64) {
	t.Helper()
	lo, hi := int64(-1), int64(-1)
	for tick := range ticks {
		if lo < 0 || tick < lo {
			lo = tick
		}
		hi = max(hi, tick)
	}
	for tick := lo; tick < hi-2*every; tick += every {
		assert.True(t, ticks[tick], "tick %d skipped", tick)
	}
}

func cutLast(s, sep string) (string, string, bool) {
	for i := len(s) - len(sep); i >= 0; i-- {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}
