package delayqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clockQueue is a one-bucket queue on miniredis with the server clock held
// still, so a test moves time by hand.
func clockQueue(t *testing.T, opts ...Option) (*DelayQueue, *miniredis.Miniredis, *redis.Client, func(time.Duration)) {
	m := miniredis.RunT(t)
	now := time.UnixMilli(1_700_000_000_000)
	m.SetTime(now)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	q := newQueue(t, c, append([]Option{WithBuckets(1)}, opts...)...)
	advance := func(d time.Duration) {
		now = now.Add(d)
		m.SetTime(now)
	}
	return q, m, c, advance
}

func TestMoveDue(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// seed pushes jobs and moves the clock; it returns the IDs to check.
		seed      func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string
		opts      []Option
		moved     int
		next      time.Duration
		wantState State
		attempts  int
	}{
		{
			name: "a due job becomes ready",
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				id := pushed(t, q, &Job{Topic: "t", Delay: time.Second})
				advance(time.Second)
				return []string{id}
			},
			moved: 1, next: -1, wantState: StateReady,
		},
		{
			name: "a job not yet due stays, and the next due time is returned",
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				id := pushed(t, q, &Job{Topic: "t", Delay: 2 * time.Second})
				advance(1500 * time.Millisecond)
				return []string{id}
			},
			moved: 0, next: 500 * time.Millisecond, wantState: StateDelayed,
		},
		{
			name: "a due job is moved, a later one waits",
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				id := pushed(t, q, &Job{Topic: "t", Delay: time.Second})
				pushed(t, q, &Job{Topic: "t", Delay: 3 * time.Second})
				advance(time.Second)
				return []string{id}
			},
			moved: 1, next: 2 * time.Second, wantState: StateReady,
		},
		{
			name: "an expired reservation becomes ready again",
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				id := pushed(t, q, &Job{Topic: "t", TTR: 5 * time.Second})
				c, err := q.reserve(ctx, 0, "t", 1, 0, reserveGreedy)
				require.NoError(t, err)
				jobs := c.jobs
				require.Len(t, jobs, 1)
				require.Equal(t, id, jobs[0].ID)
				advance(5 * time.Second)
				return []string{id}
			},
			moved: 1, next: -1, wantState: StateReady, attempts: 1,
		},
		{
			name: "a reservation not yet expired stays",
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				id := pushed(t, q, &Job{Topic: "t", TTR: 5 * time.Second})
				c, err := q.reserve(ctx, 0, "t", 1, 0, reserveGreedy)
				require.NoError(t, err)
				jobs := c.jobs
				require.Len(t, jobs, 1)
				advance(4 * time.Second)
				return []string{id}
			},
			moved: 0, next: time.Second, wantState: StateReserved, attempts: 1,
		},
		{
			name: "an expired reservation with no attempts left is dead",
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				id := pushed(t, q, &Job{Topic: "t", TTR: time.Second, MaxAttempts: 1})
				c, err := q.reserve(ctx, 0, "t", 1, 0, reserveGreedy)
				require.NoError(t, err)
				jobs := c.jobs
				require.Len(t, jobs, 1)
				advance(time.Second)
				return []string{id}
			},
			moved: 1, next: -1, wantState: StateDead, attempts: 1,
		},
		{
			name: "a backlog moves one batch at a time",
			opts: []Option{WithBatchSize(2)},
			seed: func(t *testing.T, q *DelayQueue, advance func(time.Duration)) []string {
				var ids []string
				for i := range 5 {
					ids = append(ids, pushed(t, q, &Job{Topic: "t", Delay: time.Duration(i+1) * time.Millisecond}))
				}
				advance(time.Second)
				return ids[:2]
			},
			moved: 2, next: 0, wantState: StateReady,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, _, c, advance := clockQueue(t, tc.opts...)
			ids := tc.seed(t, q, advance)
			res, err := q.moveDue(ctx, 0, "token", false)
			require.NoError(t, err)
			assert.Equal(t, tc.moved, res.moved)
			assert.Equal(t, tc.next, res.next)
			made := 0
			for _, r := range res.ready {
				assert.Equal(t, "t", r.topic)
				made += r.count
			}
			if tc.wantState == StateReady {
				assert.Equal(t, tc.moved, made, "the reply counts the jobs made ready")
			} else {
				assert.Zero(t, made)
			}
			for _, id := range ids {
				job, err := q.Get(ctx, id)
				require.NoError(t, err)
				assert.Equal(t, tc.wantState, job.State)
				assert.Equal(t, tc.attempts, job.Attempts)
				bk := q.keys.bucket(0)
				inReady, err := c.LPos(ctx, bk.ready("t"), id, redis.LPosArgs{}).Result()
				if tc.wantState == StateReady {
					assert.NoError(t, err, "a ready job is in its ready list")
					assert.GreaterOrEqual(t, inReady, int64(0))
				}
				_, zerr := c.ZScore(ctx, bk.zset, id).Result()
				assert.Equal(t, tc.wantState == StateDelayed || tc.wantState == StateReserved, zerr == nil,
					"only delayed and reserved jobs are in the bucket")
				_, derr := c.ZScore(ctx, bk.dead("t"), id).Result()
				assert.Equal(t, tc.wantState == StateDead, derr == nil, "only dead jobs are in the dead letters")
			}
		})
	}
}

func TestMoveIsSafeToRunTwice(t *testing.T) {
	ctx := context.Background()
	q, _, c, advance := clockQueue(t)
	id := pushed(t, q, &Job{Topic: "t", Delay: time.Second})
	advance(time.Second)
	for range 2 {
		_, err := q.moveDue(ctx, 0, "token", false)
		require.NoError(t, err)
	}
	ids, err := c.LRange(ctx, q.keys.bucket(0).ready("t"), 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{id}, ids, "a job is moved once")
}

func TestReschedule(t *testing.T) {
	ctx := context.Background()
	q, _, _, advance := clockQueue(t)
	id := pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
	require.NoError(t, q.RescheduleIn(ctx, id, time.Minute))
	advance(time.Minute)
	now := time.UnixMilli(1_700_000_000_000).Add(time.Minute) // the server's clock
	res, err := q.moveDue(ctx, 0, "token", false)
	require.NoError(t, err)
	assert.Equal(t, 1, res.moved, "due after the new delay")

	// A ready job can be put off again; its stale list entry is skipped.
	require.NoError(t, q.RescheduleAt(ctx, id, now.Add(time.Hour)))
	_, err = q.Pop(ctx, "t", 0)
	assert.ErrorIs(t, err, ErrNoJob)
	got, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, now.Add(time.Hour).UnixMilli(), got.RunAt.UnixMilli())
	require.NoError(t, q.RescheduleAt(ctx, id, now.Add(-time.Hour)), "a time in the past: ready now")
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	assert.Equal(t, id, job.ID)

	assert.ErrorIs(t, q.RescheduleIn(ctx, id, time.Minute), ErrNotPending)
	assert.ErrorIs(t, q.RescheduleIn(ctx, "nope", time.Minute), ErrNotFound)
	assert.ErrorIs(t, q.RescheduleIn(ctx, id, -time.Minute), ErrInvalidJob)
	assert.ErrorIs(t, q.RescheduleAt(ctx, id, maxRunAt.Add(time.Millisecond)), ErrInvalidJob)
	assert.ErrorIs(t, q.RescheduleAt(ctx, id, time.Time{}), ErrInvalidJob, "a zero time is a mistake, not now")
}

func TestRescheduleInAndAtOnEveryBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		id := pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		at := time.UnixMilli(serverMs(t, be.client)).Add(3 * time.Hour)
		require.NoError(t, q.RescheduleAt(ctx, id, at))
		got, err := q.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, at.UnixMilli(), got.RunAt.UnixMilli())
		require.NoError(t, q.RescheduleIn(ctx, id, 0))
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, id, job.ID)
		assert.ErrorIs(t, q.RescheduleAt(ctx, id, at), ErrNotPending)
	})
}

// RescheduleIn and RescheduleAt move a pending job: a reserved one is its
// consumer's, and is refused, unchanged. Once its reservation ran out and it
// is ready again, it can be moved, and the late consumer's Finish is
// refused.
func TestRescheduleRefusesAReservedJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		pushed(t, q, &Job{ID: "held", Topic: "t"})
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.ErrorIs(t, q.RescheduleIn(ctx, "held", time.Minute), ErrNotPending)
		assert.ErrorIs(t, q.RescheduleAt(ctx, "held", time.Now().Add(time.Minute)), ErrNotPending)
		got, err := q.Get(ctx, "held")
		require.NoError(t, err)
		assert.Equal(t, StateReserved, got.State)
		assert.Equal(t, job.ReservedUntil, got.ReservedUntil)
		require.NoError(t, q.Finish(ctx, "held"), "its consumer settles it as if nothing happened")

		pushed(t, q, &Job{ID: "late", Topic: "t", TTR: 20 * time.Millisecond})
		job, err = q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		startQueue(t, q)
		require.Eventually(t, func() bool {
			got, err := q.Get(ctx, "late")
			return err == nil && got.State == StateReady
		}, 10*time.Second, 5*time.Millisecond, "its reservation runs out")
		require.NoError(t, q.RescheduleIn(ctx, "late", time.Minute))
		assert.ErrorIs(t, q.Finish(ctx, job.ID), ErrReservationLost)
		assert.ErrorIs(t, q.Retry(ctx, job, errors.New("late")), ErrReservationLost)
		got, err = q.Get(ctx, "late")
		require.NoError(t, err)
		assert.Equal(t, StateDelayed, got.State)
	})
}
