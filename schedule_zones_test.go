package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue/internal/zones"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// useZones has every schedule of the test find its zones with load, as a
// process whose binary embeds Go's database (time/tzdata) or reads the
// system's does. Call it before making the test's queues, so that their
// goroutines have ended when the loader is restored.
func useZones(t *testing.T, load func(string) (*time.Location, error)) {
	was := loadLocation
	loadLocation = load
	t.Cleanup(func() { loadLocation = was })
}

// startedAt returns a started queue of one bucket on a miniredis whose clock
// reads now, and a function that moves that clock.
func startedAt(t *testing.T, now time.Time, opts ...Option) (*DelayQueue, func(time.Time)) {
	m := miniredis.RunT(t)
	m.SetTime(now)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	q := newQueue(t, c, append([]Option{WithBuckets(1), WithSafetyPoll(5 * time.Millisecond)}, opts...)...)
	return q, m.SetTime
}

// A daily cron in a zone with summer time keeps ticking over the last days
// of leap years, where Go's zone bounds go wrong (go.dev/issue/81583), on
// both zone databases: each tick is delivered, the schedule moves on to the
// next day, a job pushed to its bucket meanwhile is delivered, and Close
// ends in time. Mid-June is the control.
func TestDailyCronTicksThroughTheLastDaysOfLeapYears(t *testing.T) {
	for _, db := range zones.Both(t) {
		for _, day := range []string{"2028-06-14", "2028-12-30", "2032-12-30", "2040-12-30"} {
			t.Run(db.Name+"/"+day, func(t *testing.T) {
				useZones(t, db.Load)
				ctx := context.Background()
				berlin, err := db.Load("Europe/Berlin")
				require.NoError(t, err)
				first, err := time.ParseInLocation("2006-01-02 15:04", day+" 03:00", berlin)
				require.NoError(t, err)
				q, setTime := startedAt(t, first.Add(-time.Minute))
				require.NoError(t, q.Schedule(ctx, Schedule{Name: "nightly", Cron: "0 3 * * *", Location: berlin, Job: Job{Topic: "t"}}))
				startQueue(t, q)

				for i, tick := range []time.Time{first, first.AddDate(0, 0, 1), first.AddDate(0, 0, 2)} {
					setTime(tick.Add(time.Millisecond))
					job, err := q.Pop(ctx, "t", 10*time.Second)
					require.NoError(t, err, "tick %d, %v", i, tick)
					assert.Equal(t, q.tickID("nightly", tick.UnixMilli()), job.ID)
					assert.True(t, tick.Equal(job.RunAt), "RunAt %v", job.RunAt)
					require.NoError(t, q.Finish(ctx, job.ID))
					next := tick.AddDate(0, 0, 1)
					require.Eventually(t, func() bool {
						list, err := q.Schedules(ctx)
						return err == nil && len(list) == 1 && list[0].Next.Equal(next)
					}, 10*time.Second, time.Millisecond, "the schedule moves on to %v", next)

					// The bucket's other jobs are not held.
					setTime(tick.Add(300 * time.Millisecond))
					id := pushed(t, q, &Job{Topic: "other", Delay: 300 * time.Millisecond})
					setTime(tick.Add(601 * time.Millisecond))
					job, err = q.Pop(ctx, "other", 10*time.Second)
					require.NoError(t, err)
					assert.Equal(t, id, job.ID)
					require.NoError(t, q.Finish(ctx, job.ID))
				}
				closing, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				require.NoError(t, q.Close(closing))
			})
		}
	}
}

// failRecorder keeps the EventTickFailed and EventTick events.
type failRecorder struct {
	mu     sync.Mutex
	failed []Event
	ticked map[string]int
}

func (r *failRecorder) Observe(_ context.Context, e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case EventTickFailed:
		r.failed = append(r.failed, e)
	case EventTick:
		r.ticked[e.Schedule] += e.Count
	}
}

func (r *failRecorder) ticks(schedule string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ticked[schedule]
}

func (r *failRecorder) failures() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.failed...)
}

// A schedule whose next tick cannot be computed, whatever the reason (here a
// zone the firing process cannot load, and a computation that panics), is
// reported and waits alone: the bucket's jobs and its other schedules keep
// moving, and it ticks again once it can be computed.
func TestAScheduleThatCannotTickWaitsAlone(t *testing.T) {
	for _, fault := range []string{"no such zone", "panic"} {
		t.Run(fault, func(t *testing.T) {
			ctx := context.Background()
			rec := &failRecorder{ticked: map[string]int{}}
			log := &capture{}
			start := time.Date(2027, 5, 3, 9, 59, 0, 0, time.UTC)
			// Once the schedules are made, this process cannot compute
			// Tokyo's ticks. (The zones are chosen before the queue is
			// made, so that its goroutines end before they are restored.)
			var broken sync.Mutex
			isBroken := false
			useZones(t, func(name string) (*time.Location, error) {
				broken.Lock()
				defer broken.Unlock()
				if name == "Asia/Tokyo" && isBroken {
					if fault == "panic" {
						panic("zone data unreadable")
					}
					return nil, fmt.Errorf("unknown time zone %s", name)
				}
				return time.LoadLocation(name)
			})
			q, setTime := startedAt(t, start, WithObserver(rec), WithLogger(log.logger()))
			tokyo, err := time.LoadLocation("Asia/Tokyo")
			require.NoError(t, err)
			require.NoError(t, q.Schedule(ctx, Schedule{Name: "broken", Cron: "* * * * *", Location: tokyo, Job: Job{Topic: "b"}}))
			require.NoError(t, q.Schedule(ctx, Schedule{Name: "fine", Cron: "* * * * *", Job: Job{Topic: "f"}}))
			broken.Lock()
			isBroken = true
			broken.Unlock()
			startQueue(t, q)

			// Both ticks at 10:00 are delivered (their jobs were pushed
			// ahead); only "fine" moves on.
			setTime(start.Add(time.Minute))
			for _, topic := range []string{"b", "f"} {
				job, err := q.Pop(ctx, topic, 10*time.Second)
				require.NoError(t, err, topic)
				require.NoError(t, q.Finish(ctx, job.ID))
			}
			require.Eventually(t, func() bool { return len(rec.failures()) > 0 }, 10*time.Second, time.Millisecond)
			e := rec.failures()[0]
			assert.Equal(t, EventTickFailed, e.Kind)
			assert.Equal(t, "broken", e.Schedule)
			assert.Equal(t, "b", e.Topic)
			require.Error(t, e.Err)
			if fault == "panic" {
				assert.Contains(t, e.Err.Error(), "zone data unreadable")
			} else {
				assert.Contains(t, e.Err.Error(), "unknown time zone")
			}
			assert.Contains(t, log.String(), "cannot compute a schedule's next tick")

			// The bucket's jobs and the other schedule keep moving; the
			// broken one pushed nothing.
			id := pushed(t, q, &Job{Topic: "other"})
			job, err := q.Pop(ctx, "other", 10*time.Second)
			require.NoError(t, err)
			assert.Equal(t, id, job.ID)
			setTime(start.Add(2 * time.Minute))
			job, err = q.Pop(ctx, "f", 10*time.Second)
			require.NoError(t, err)
			assert.Equal(t, q.tickID("fine", start.Add(2*time.Minute).UnixMilli()), job.ID)
			_, err = q.Pop(ctx, "b", 0)
			assert.ErrorIs(t, err, ErrNoJob, "the broken schedule pushed nothing")
			require.Eventually(t, func() bool { return len(rec.failures()) == 2 && rec.ticks("fine") == 2 }, 10*time.Second, time.Millisecond,
				"tried again after a minute")

			// Once its ticks can be computed, it ticks again on its grid.
			broken.Lock()
			isBroken = false
			broken.Unlock()
			list, err := q.Schedules(ctx)
			require.NoError(t, err)
			require.Len(t, list, 2)
			retryAt := start.Add(2*time.Minute + tickRetry)
			assert.Equal(t, "broken", list[0].Name)
			assert.True(t, list[0].Next.Equal(retryAt), "the broken schedule waits: %v", list[0].Next)
			setTime(retryAt.Add(time.Millisecond))
			require.Eventually(t, func() bool {
				list, err := q.Schedules(ctx)
				return err == nil && len(list) == 2 && list[0].Next.Equal(retryAt.Add(time.Minute))
			}, 10*time.Second, time.Millisecond, "broken ticks again")
			setTime(retryAt.Add(time.Minute))
			job, err = q.Pop(ctx, "b", 10*time.Second)
			require.NoError(t, err)
			assert.Equal(t, q.tickID("broken", retryAt.Add(time.Minute).UnixMilli()), job.ID)
			assert.Len(t, rec.failures(), 2, "tried again a minute later, and no sooner")
		})
	}
}

// A schedule refused for a tick that cannot be computed says so, matchably.
func TestAScheduleWhoseTickCannotBeComputedIsRefused(t *testing.T) {
	useZones(t, func(name string) (*time.Location, error) { return nil, errors.New("no zone database") })
	q := newQueue(t, miniredisClient(t))
	berlin := time.FixedZone("Europe/Berlin", 3600)
	err := q.Schedule(context.Background(), Schedule{Name: "s", Cron: "0 3 * * *", Location: berlin, Job: Job{Topic: "t"}})
	assert.ErrorIs(t, err, ErrInvalidSchedule)
	list, err := q.Schedules(context.Background())
	require.NoError(t, err)
	assert.Empty(t, list)
}
