package delayqueue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGetShowsStateAndDueTime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		before := serverMs(t, be.client)
		id := pushed(t, q, &Job{Topic: "t", Body: []byte("b"), Delay: time.Hour, TTR: 2 * time.Second, MaxAttempts: 3})
		after := serverMs(t, be.client)
		job, err := q.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, id, job.ID)
		assert.Equal(t, StateDelayed, job.State)
		assert.Equal(t, 2*time.Second, job.TTR)
		assert.Equal(t, 3, job.MaxAttempts)
		assert.Equal(t, 0, job.Attempts)
		due := job.RunAt.UnixMilli()
		assert.GreaterOrEqual(t, due, before+time.Hour.Milliseconds(), "due one hour after push on the server's clock")
		assert.LessOrEqual(t, due, after+time.Hour.Milliseconds()+1, "rounded up to the next millisecond")

		_, err = q.Get(ctx, "no-such-job")
		assert.ErrorIs(t, err, ErrNotFound)
		_, err = q.Get(ctx, "")
		assert.ErrorIs(t, err, ErrInvalidID)
	})
}

func TestPushDefaultsAndRunAt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithDefaultTTR(7*time.Second), WithMaxAttempts(4))
		runAt := time.Now().Add(time.Hour).Truncate(time.Millisecond)
		id := pushed(t, q, &Job{Topic: "t", RunAt: runAt})
		job, err := q.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runAt.UnixMilli(), job.RunAt.UnixMilli(), "RunAt is kept as given")
		assert.Equal(t, 7*time.Second, job.TTR)
		assert.Equal(t, 4, job.MaxAttempts)

		past := pushed(t, q, &Job{Topic: "t", RunAt: time.Now().Add(-time.Hour)})
		job, err = q.Get(ctx, past)
		require.NoError(t, err)
		assert.Equal(t, StateReady, job.State, "a job due in the past is ready at once")
	})
}

func TestCallerIDMakesPushIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		for range 3 {
			id, err := q.Push(ctx, &Job{ID: "order-42", Topic: "t", Body: []byte("first")})
			require.NoError(t, err)
			assert.Equal(t, "order-42", id)
		}
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, []byte("first"), job.Body)
		_, err = q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "one job, one delivery")

		// While the job exists, even a different body does not replace it.
		_, err = q.Push(ctx, &Job{ID: "order-42", Topic: "t", Body: []byte("second")})
		require.NoError(t, err)
		got, err := q.Get(ctx, "order-42")
		require.NoError(t, err)
		assert.Equal(t, []byte("first"), got.Body)
		assert.Equal(t, StateReserved, got.State)

		// Once it is gone, the ID can be used again.
		require.NoError(t, q.Finish(ctx, "order-42"))
		_, err = q.Push(ctx, &Job{ID: "order-42", Topic: "t", Body: []byte("third")})
		require.NoError(t, err)
		job, err = q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, []byte("third"), job.Body)
	})
}

func TestACallerIDTwiceInOnePushMakesOneJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		ids, err := q.PushMany(ctx, []*Job{
			{ID: "a", Topic: "t", Body: []byte("first")},
			{ID: "a", Topic: "t", Body: []byte("second")},
			{ID: "b", Topic: "t", Body: []byte("first"), Delay: time.Hour},
			{ID: "b", Topic: "t", Body: []byte("second")},
			{ID: "c", Topic: "t", Body: []byte("first")},
			{ID: "c", Topic: "t", Body: []byte("second"), Delay: time.Hour},
		})
		require.NoError(t, err)
		assert.Equal(t, []PushResult{{ID: "a"}, {ID: "a", Existed: true}, {ID: "b"}, {ID: "b", Existed: true}, {ID: "c"}, {ID: "c", Existed: true}}, ids)
		for id, state := range map[string]State{"a": StateReady, "b": StateDelayed, "c": StateReady} {
			job, err := q.Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, []byte("first"), job.Body, id)
			assert.Equal(t, state, job.State, id)
		}
		n, err := be.client.LLen(ctx, q.keys.bucket(0).ready("t")).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(2), n, "one ready-list entry per job")
	})
}

func TestFinish(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		id := pushed(t, q, &Job{Topic: "t"})
		assert.ErrorIs(t, q.Finish(ctx, id), ErrNotReserved, "a ready job cannot be finished")

		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Finish(ctx, job.ID))
		_, err = q.Get(ctx, id)
		assert.ErrorIs(t, err, ErrNotFound, "a finished job is gone")
		assert.ErrorIs(t, q.Finish(ctx, id), ErrNotFound, "a second finish changes nothing")
		assert.ErrorIs(t, q.Finish(ctx, "never-pushed"), ErrNotFound)
		assert.ErrorIs(t, q.Finish(ctx, ""), ErrInvalidID)

		delayed := pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		assert.ErrorIs(t, q.Finish(ctx, delayed), ErrNotReserved)
		got, err := q.Get(ctx, delayed)
		require.NoError(t, err)
		assert.Equal(t, StateDelayed, got.State, "a refused finish changes nothing")
	})
}

func TestRemoveCancelsInEveryState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))

		delayed := pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		ready := pushed(t, q, &Job{Topic: "t"})
		require.NoError(t, q.Remove(ctx, delayed))
		require.NoError(t, q.Remove(ctx, ready))
		_, err := q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "a removed ready job is skipped, not delivered")

		pushed(t, q, &Job{Topic: "t"})
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Remove(ctx, job.ID))
		assert.ErrorIs(t, q.Finish(ctx, job.ID), ErrNotFound, "a removed reserved job cannot be finished")

		for _, id := range []string{delayed, ready, job.ID} {
			_, err := q.Get(ctx, id)
			assert.ErrorIs(t, err, ErrNotFound)
			assert.ErrorIs(t, q.Remove(ctx, id), ErrNotFound)
		}
		bk := q.keys.bucket(0)
		n, err := be.client.ZCard(ctx, bk.zset).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "nothing is left in the bucket")
		n, err = be.client.HLen(ctx, bk.pool).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "nothing is left in the pool")
	})
}

func TestRemoveDeadJob(t *testing.T) {
	ctx := context.Background()
	q, _, c, advance := clockQueue(t)
	id := pushed(t, q, &Job{Topic: "t", TTR: time.Second, MaxAttempts: 1})
	_, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	advance(time.Second)
	_, err = q.moveDue(ctx, 0, "token", false)
	require.NoError(t, err)
	job, err := q.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, StateDead, job.State)

	require.NoError(t, q.Remove(ctx, id))
	n, err := c.ZCard(ctx, q.keys.bucket(0).dead("t")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a removed dead job leaves the dead letters")
}

func TestADedupWindowKeepsTheIDOfAFinishedOrRemovedJobTaken(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		// The producer sets the window; the worker, which finishes and
		// removes, has no such option: the window travels with each job.
		producer := newQueue(t, be.client, WithName(name), WithDedupWindow(time.Hour))
		worker := newQueue(t, be.client, WithName(name))
		absent := func(id string) {
			t.Helper()
			_, err := worker.Get(ctx, id)
			assert.ErrorIs(t, err, ErrNotFound, "pushing %s again brought it back", id)
		}

		for _, delay := range []time.Duration{0, time.Hour} { // due now, and for later
			id := "cancel-order-" + delay.String()
			pushed(t, producer, &Job{ID: id, Topic: "t", Delay: delay})
			job, err := producer.Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, time.Hour, job.DedupWindow)
			require.NoError(t, worker.Remove(ctx, id)) // the order was paid
			again, err := producer.Push(ctx, &Job{ID: id, Topic: "t", Delay: delay})
			require.NoError(t, err, "a retried push is answered as a duplicate")
			assert.Equal(t, id, again)
			absent(id)
		}

		pushed(t, producer, &Job{ID: "send-receipt", Topic: "t"})
		job, err := worker.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, worker.Finish(ctx, job.ID))
		pushed(t, producer, &Job{ID: "send-receipt", Topic: "t"})
		absent("send-receipt")

		// A job's own window wins; without any, the ID is free at once.
		pushed(t, worker, &Job{ID: "no-window", Topic: "t", Delay: time.Hour})
		require.NoError(t, worker.Remove(ctx, "no-window"))
		pushed(t, worker, &Job{ID: "no-window", Topic: "t", Delay: time.Hour})
		_, err = worker.Get(ctx, "no-window")
		assert.NoError(t, err)
		pushed(t, worker, &Job{ID: "own-window", Topic: "t", Delay: time.Hour, DedupWindow: time.Hour})
		require.NoError(t, worker.Remove(ctx, "own-window"))
		pushed(t, worker, &Job{ID: "own-window", Topic: "t", Delay: time.Hour})
		absent("own-window")
	})
}

func TestATombstoneLastsItsWindowThenGoes(t *testing.T) {
	ctx := context.Background()
	q, m, _, advance := clockQueue(t, WithDedupWindow(time.Minute))
	id := pushed(t, q, &Job{ID: "pay-42", Topic: "t", Delay: time.Hour})
	require.NoError(t, q.Remove(ctx, id))
	dedup := q.keys.bucket(0).dedup
	advance(time.Minute - time.Millisecond)
	pushed(t, q, &Job{ID: id, Topic: "t"})
	_, err := q.Get(ctx, id)
	assert.ErrorIs(t, err, ErrNotFound, "within the window")

	advance(time.Millisecond)
	_, err = q.moveDue(ctx, 0, "token", true)
	require.NoError(t, err)
	assert.False(t, m.Exists(dedup), "the handler deletes tombstones whose window ended")
	pushed(t, q, &Job{ID: id, Topic: "t"})
	_, err = q.Get(ctx, id)
	assert.NoError(t, err, "after the window the ID is free")
}

func TestTombstonesGoWhenTheirWindowEnds(t *testing.T) {
	ctx := context.Background()
	c := redistest.Shared(t).Client(t)
	q := newQueue(t, c, WithDedupWindow(200*time.Millisecond), WithSafetyPoll(300*time.Millisecond))
	startQueue(t, q)
	for i := range 10 {
		id := pushed(t, q, &Job{ID: fmt.Sprintf("j%d", i), Topic: "t", Delay: time.Hour})
		require.NoError(t, q.Remove(ctx, id))
	}
	require.Eventually(t, func() bool {
		for b := range q.opts.buckets {
			if c.Exists(ctx, q.keys.bucket(b).dedup).Val() != 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "a started queue deletes tombstones past their window")
}

func TestPushSaysWhetherItCreatedTheJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		res, err := pushWithResult(ctx, q, &Job{ID: "order-1", Topic: "t", Body: []byte("first")})
		require.NoError(t, err)
		assert.Equal(t, PushResult{ID: "order-1"}, res)
		res, err = pushWithResult(ctx, q, &Job{ID: "order-1", Topic: "t", Body: []byte("second")})
		require.NoError(t, err)
		assert.Equal(t, PushResult{ID: "order-1", Existed: true}, res)
		got, err := q.Get(ctx, "order-1")
		require.NoError(t, err)
		assert.Equal(t, "first", string(got.Body), "an existing job is left as it was")

		generated := &Job{Topic: "t"}
		res, err = pushWithResult(ctx, q, generated)
		require.NoError(t, err)
		assert.False(t, res.Existed)
		res, err = pushWithResult(ctx, q, generated)
		require.NoError(t, err)
		assert.Equal(t, PushResult{ID: generated.ID}, res, "the same job pushed twice")

		results, err := q.PushMany(ctx, []*Job{
			{ID: "order-1", Topic: "t"}, {ID: "order-2", Topic: "t"}, {ID: "order-2", Topic: "t"},
		})
		require.NoError(t, err)
		assert.Equal(t, []PushResult{{ID: "order-1", Existed: true}, {ID: "order-2"}, {ID: "order-2", Existed: true}}, results)
	})
}
