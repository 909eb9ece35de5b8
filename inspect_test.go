package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countByScan counts the queue's jobs per topic and state the slow way: by
// reading every job of every bucket.
func countByScan(t *testing.T, q *DelayQueue) (map[string]Counts, int) {
	t.Helper()
	ctx := context.Background()
	per, jobs := map[string]Counts{}, 0
	for b := range q.opts.buckets {
		all, err := q.client.HGetAll(ctx, q.keys.bucket(b).pool).Result()
		require.NoError(t, err)
		for id, v := range all {
			job, err := decodeJob(id, []byte(v))
			require.NoError(t, err)
			c := per[job.Topic]
			switch job.State {
			case StateDelayed:
				c.Delayed++
			case StateReady:
				c.Ready++
			case StateReserved:
				c.Reserved++
			case StateDead:
				c.Dead++
			}
			per[job.Topic] = c
			jobs++
		}
	}
	return per, jobs
}

// withoutAges drops the OldestReady of each topic's counts.
func withoutAges(per map[string]Counts) map[string]Counts {
	out := map[string]Counts{}
	for topic, c := range per {
		c.OldestReady = 0
		out[topic] = c
	}
	return out
}

// TestCountsFollowEveryTransition drives jobs through every script that
// changes a job's state, at random, and checks after each step that the
// counts the scripts keep agree with a count of the jobs themselves.
func TestCountsFollowEveryTransition(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(4))
		rng := rand.New(rand.NewSource(1))
		topics := []string{"a", "b", "c"}
		var ids []string
		var held []*Job
		topic := func() string { return topics[rng.Intn(len(topics))] }
		delay := func() time.Duration { return []time.Duration{0, time.Millisecond, time.Hour}[rng.Intn(3)] }
		anyID := func() string {
			if len(ids) == 0 || rng.Intn(4) == 0 {
				return fmt.Sprintf("id-%d", rng.Intn(20)) // a caller's ID, maybe taken
			}
			return ids[rng.Intn(len(ids))]
		}
		takeHeld := func() *Job {
			if len(held) == 0 {
				return nil
			}
			i := rng.Intn(len(held))
			job := held[i]
			held = append(held[:i], held[i+1:]...)
			return job
		}
		newJob := func() *Job {
			job := &Job{Topic: topic(), Delay: delay(), MaxAttempts: 1 + rng.Intn(2)}
			if rng.Intn(3) == 0 {
				job.ID = fmt.Sprintf("id-%d", rng.Intn(20))
			}
			if rng.Intn(3) == 0 {
				job.TTR = time.Millisecond // its reservation runs out
			}
			return job
		}
		ops := []func() error{
			func() error {
				id, err := q.Push(ctx, newJob())
				ids = append(ids, id)
				return err
			},
			func() error {
				got, err := q.PushMany(ctx, []*Job{newJob(), newJob(), newJob()})
				for _, r := range got {
					ids = append(ids, r.ID)
				}
				return err
			},
			func() error {
				job, err := q.Pop(ctx, topic(), 0)
				if job != nil {
					held = append(held, job)
				}
				return err
			},
			func() error {
				if job := takeHeld(); job != nil {
					return q.Finish(ctx, job.ID)
				}
				return nil
			},
			func() error {
				if job := takeHeld(); job != nil {
					return q.RetryAfter(ctx, job, delay(), errors.New("failed"))
				}
				return nil
			},
			func() error {
				if job := takeHeld(); job != nil {
					return q.Retry(ctx, job, ErrSkipRetry)
				}
				return nil
			},
			func() error {
				if job := takeHeld(); job != nil {
					return q.Release(ctx, job)
				}
				return nil
			},
			func() error { return q.Remove(ctx, anyID()) },
			func() error { return q.RescheduleIn(ctx, anyID(), delay()) },
			func() error {
				job := newJob()
				job.ID = anyID()
				if generated(job.ID) {
					return nil
				}
				_, err := q.Upsert(ctx, job)
				return err
			},
			func() error { return q.RequeueDead(ctx, anyID()) },
			func() error { _, err := q.RequeueAllDead(ctx, topic()); return err },
			func() error { _, err := q.PurgeDead(ctx, topic()); return err },
			func() error {
				for b := range q.opts.buckets {
					if _, err := q.moveDue(ctx, b, "token", false); err != nil {
						return err
					}
				}
				return nil
			},
		}
		for step := range 400 {
			op := rng.Intn(len(ops))
			err := ops[op]()
			if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNotPending) &&
				!errors.Is(err, ErrReservationLost) && !errors.Is(err, ErrNotReserved) && !errors.Is(err, ErrNoJob) {
				require.NoError(t, err, "step %d, op %d", step, op)
			}
			want, jobs := countByScan(t, q)
			ov, err := q.Overview(ctx)
			require.NoError(t, err)
			require.Equal(t, want, withoutAges(ov.Topics), "step %d, op %d", step, op)
			require.Equal(t, jobs, ov.Jobs, "step %d", step)
		}
	})
}

// fillStates gives topic "t" jobs in every state (3 delayed, 1 ready, 1
// reserved, 1 dead) and "other" one ready job.
func fillStates(t *testing.T, q *DelayQueue) {
	t.Helper()
	killJobs(t, q, "t", 1)
	for range 3 {
		pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
	}
	pushed(t, q, &Job{Topic: "t"})
	pushed(t, q, &Job{Topic: "t"})
	pushed(t, q, &Job{Topic: "other"})
	job, err := q.Pop(context.Background(), "t", 0)
	require.NoError(t, err)
	require.NotNil(t, job)
}

// TestZeroCountsGo: the counts of a topic whose jobs are all gone are
// deleted by the bucket handler's next trim, not left to pile up.
func TestZeroCountsGo(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		for _, topic := range []string{"a", "b"} {
			pushed(t, q, &Job{Topic: topic})
			job, err := q.Pop(ctx, topic, 0)
			require.NoError(t, err)
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		pushed(t, q, &Job{Topic: "b", Delay: time.Hour})
		ov, err := q.Overview(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]Counts{"b": {Delayed: 1}}, ov.Topics, "zeros are not reported")
		counts := q.keys.bucket(0).counts
		require.NotZero(t, be.client.HLen(ctx, counts).Val())
		_, err = q.moveDue(ctx, 0, "token", true)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"1:b": "1"}, be.client.HGetAll(ctx, counts).Val())
	})
}

func TestOverviewAndCounts(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		fillStates(t, q)
		require.NoError(t, q.Pause(ctx, "idle"))

		var ov Overview
		require.Eventually(t, func() bool { // the server's clock goes on
			var err error
			ov, err = q.Overview(ctx)
			require.NoError(t, err)
			return ov.Topics["t"].OldestReady > 0
		}, 10*time.Second, time.Millisecond)
		tc := ov.Topics["t"]
		assert.Equal(t, Counts{Delayed: 3, Ready: 1, Reserved: 1, Dead: 1}, Counts{tc.Delayed, tc.Ready, tc.Reserved, tc.Dead, 0})
		assert.Equal(t, Counts{Ready: 1}, withoutAges(ov.Topics)["other"])
		assert.Equal(t, Counts{}, ov.Topics["idle"], "a paused topic shows with no jobs")
		assert.Equal(t, []string{"idle"}, ov.Paused)
		assert.Equal(t, 7, ov.Jobs)
		assert.Equal(t, 7, ov.Total.Delayed+ov.Total.Ready+ov.Total.Reserved+ov.Total.Dead)
		assert.Equal(t, max(tc.OldestReady, ov.Topics["other"].OldestReady), ov.Total.OldestReady)
		assert.Equal(t, q.opts.buckets, ov.Buckets)

		c, err := q.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, Counts{Delayed: 3, Ready: 1, Reserved: 1, Dead: 1}, Counts{c.Delayed, c.Ready, c.Reserved, c.Dead, 0})
		assert.GreaterOrEqual(t, c.OldestReady, tc.OldestReady)
		c, err = q.Counts(ctx, "nothing")
		require.NoError(t, err)
		assert.Equal(t, Counts{}, c)
		ov, err = q.Overview(ctx)
		require.NoError(t, err)
		topics := make([]string, 0, len(ov.Topics))
		for topic := range ov.Topics {
			topics = append(topics, topic)
		}
		slices.Sort(topics)
		assert.Equal(t, []string{"idle", "other", "t"}, topics)

		_, err = q.Counts(ctx, "a b")
		assert.ErrorIs(t, err, ErrInvalidTopic)
	})
}

// TestOldestReadySkipsJobsNoLongerReady: the age is the first job still
// ready, not an ID left in the list by a job removed.
func TestOldestReadySkipsJobsNoLongerReady(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	q := newQueue(t, redis.NewClient(&redis.Options{Addr: m.Addr()}), WithBuckets(1))
	start := time.Now()
	m.SetTime(start)
	old := pushed(t, q, &Job{Topic: "t"})
	m.SetTime(start.Add(time.Hour))
	pushed(t, q, &Job{Topic: "t"})
	m.SetTime(start.Add(2 * time.Hour))
	c, err := q.Counts(ctx, "t")
	require.NoError(t, err)
	assert.Equal(t, Counts{Ready: 2, OldestReady: 2 * time.Hour}, c)
	require.NoError(t, q.Remove(ctx, old)) // its ID stays at the head of the list
	c, err = q.Counts(ctx, "t")
	require.NoError(t, err)
	assert.Equal(t, Counts{Ready: 1, OldestReady: time.Hour}, c)

	// Many removed at the head, as when no consumer runs to drop them.
	var ids []string
	for range 300 {
		ids = append(ids, pushed(t, q, &Job{Topic: "u"}))
	}
	m.SetTime(start.Add(3 * time.Hour))
	for _, id := range ids[:250] {
		require.NoError(t, q.Remove(ctx, id))
	}
	c, err = q.Counts(ctx, "u")
	require.NoError(t, err)
	assert.Equal(t, Counts{Ready: 50, OldestReady: time.Hour}, c)
}

func TestInspectionOnRedisErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	m := miniredisClient(t)
	q := newQueue(t, m)
	q.client = c
	ctx := context.Background()
	_, err := q.Overview(ctx)
	assert.ErrorContains(t, err, "delayqueue: count the jobs of bucket")
	_, err = q.List(ctx, "t", StateDelayed, ListOptions{})
	assert.ErrorContains(t, err, "delayqueue: list delayed jobs")
}

// Overview of a queue with many topics takes many short script calls, not
// one long one: each looks at about summaryStep counts of a bucket.
func TestOverviewOfManyTopicsTakesBoundedSteps(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(2))
		const topics = 1050
		jobs := make([]*Job, 0, 2*topics)
		for i := range topics {
			topic := fmt.Sprintf("t%04d", i)
			jobs = append(jobs, &Job{Topic: topic}, &Job{Topic: topic, Delay: time.Hour})
		}
		_, err := q.PushMany(ctx, jobs)
		require.NoError(t, err)
		calls := &scriptCounter{script: scriptSummary}
		be.client.AddHook(calls)
		ov, err := q.Overview(ctx)
		require.NoError(t, err)
		assert.Len(t, ov.Topics, topics)
		for topic, c := range ov.Topics {
			assert.Equal(t, Counts{Delayed: 1, Ready: 1, OldestReady: c.OldestReady}, c, topic)
		}
		assert.Equal(t, 2*topics, ov.Jobs)
		assert.Equal(t, Counts{Delayed: topics, Ready: topics, OldestReady: ov.Total.OldestReady}, ov.Total)
		if be.mini == nil { // miniredis's HSCAN answers all at once
			// 2,100 counts in two buckets, about 100 a step: 20 steps
			// or more, and a last step per bucket for the dead topics.
			assert.GreaterOrEqual(t, calls.n.Load(), int64(2*topics/summaryStep))
		}
	})
}
