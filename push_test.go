package delayqueue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPushIsSafeToRunTwice(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		for _, tc := range []struct {
			name      string
			generated bool
			delay     time.Duration
			again     int64
		}{
			{"a caller's ID, for later", false, time.Hour, pushExisted},
			{"a caller's ID, due now", false, 0, pushExisted},
			// The second run finds the job it made: created, once.
			{"a generated ID, for later", true, time.Hour, pushCreated},
			{"a generated ID, due now", true, 0, pushCreated},
		} {
			a, err := q.opts.prepare(&Job{Topic: "t", Body: []byte(tc.name), Delay: tc.delay})
			require.NoError(t, err)
			a.id, a.generated = "order-"+tc.name, tc.generated
			require.NoError(t, q.push(ctx, 0, []*pushArgs{&a}))
			assert.Equal(t, int64(pushCreated), a.status, tc.name)
			require.NoError(t, q.push(ctx, 0, []*pushArgs{&a})) // as go-redis re-sends after a read timeout
			assert.Equal(t, tc.again, a.status, tc.name)
		}
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		assert.Equal(t, 4, st.Jobs)
		assert.Equal(t, 2, st.Ready, "each due job is in the ready list once")
	})
}

func TestPushManyIsOneCallPerBucketAndIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(4))
		jobs := make([]*Job, 300)
		for i := range jobs {
			jobs[i] = &Job{Topic: "t", Body: []byte{byte(i)}}
		}
		jobs[7].ID = "mine"
		ids, err := q.PushMany(ctx, jobs)
		require.NoError(t, err)
		require.Len(t, ids, 300)
		for i, job := range jobs {
			assert.Equal(t, PushResult{ID: job.ID}, ids[i], "IDs are stored in the jobs")
		}
		assert.Equal(t, "mine", ids[7].ID)
		again, err := q.PushMany(ctx, jobs) // a retry after an unclear error
		require.NoError(t, err)
		for i := range again {
			assert.Equal(t, ids[i].ID, again[i].ID)
		}
		assert.True(t, again[7].Existed, "a caller's ID exists already")
		assert.False(t, again[0].Existed, "a generated ID pushed again is the same job pushed twice")
		seen := consume(t, []*DelayQueue{q}, "t", 2, 300)
		assert.Len(t, seen, 300)
		for _, n := range seen {
			assert.Equal(t, 1, n)
		}

		bad := []*Job{{Topic: "t"}, {Topic: ""}}
		_, err = q.PushMany(ctx, bad)
		assert.ErrorIs(t, err, ErrInvalidTopic)
		assert.True(t, strings.HasPrefix(err.Error(), "job 1:"))
		assert.Empty(t, bad[0].ID, "a refused batch pushes nothing")
	})
}

func TestPushManyKeepsTheFirstOfTwoJobsWithOneID(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		for _, delay := range []time.Duration{0, time.Hour} { // due now, and later
			id := "twice-" + delay.String()
			_, err := q.PushMany(ctx, []*Job{
				{ID: id, Topic: "t", Body: []byte("first"), Delay: delay},
				{ID: id, Topic: "t", Body: []byte("second"), Delay: delay},
			})
			require.NoError(t, err)
			job, err := q.Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, "first", string(job.Body), "delay %v", delay)
		}
		st, err := readKeyStats(ctx, q, "t")
		require.NoError(t, err)
		assert.Equal(t, 2, st.Jobs)
		assert.Equal(t, 1, st.Ready, "one ID in the ready list, not two")
	})
}

func TestPushManyLoadsItsScriptAfterAFlush(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(4))
		forgetScripts(t, be.client) // as after a restart
		jobs := make([]*Job, 50)
		for i := range jobs {
			jobs[i] = &Job{Topic: "t"}
		}
		ids, err := q.PushMany(ctx, jobs)
		require.NoError(t, err)
		for _, res := range ids {
			job, err := q.Get(ctx, res.ID)
			require.NoError(t, err)
			assert.Equal(t, StateReady, job.State)
		}
	})
}

// push runs push.lua once for jobs that all belong to bucket b, outside any
// lane, and sets each one's status.
func (q *DelayQueue) push(ctx context.Context, b int, jobs []*pushArgs) error {
	keys, args := q.pushCall(b, jobs)
	return pushResult(b, jobs, q.run(ctx, b, scriptPush, keys, args...))
}

func TestUpsertCreatesOrReplacesAPendingJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithDedupWindow(time.Hour))
		get := func(id string) *Job {
			t.Helper()
			got, err := q.Get(ctx, id)
			require.NoError(t, err)
			return got
		}

		// Created, then moved and its body changed while delayed.
		res, err := q.Upsert(ctx, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("at 10:00"), Delay: time.Hour})
		require.NoError(t, err)
		assert.Equal(t, PushResult{ID: "reminder-1"}, res)
		before := time.Now()
		res, err = q.Upsert(ctx, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("at 11:00"), Delay: 2 * time.Hour})
		require.NoError(t, err)
		assert.Equal(t, PushResult{ID: "reminder-1", Existed: true}, res)
		got := get("reminder-1")
		assert.Equal(t, StateDelayed, got.State)
		assert.Equal(t, "at 11:00", string(got.Body))
		assert.WithinRange(t, got.RunAt, before.Add(2*time.Hour-time.Second), before.Add(2*time.Hour+10*time.Second))

		// Made due now: ready, once, with the new body; then delayed again
		// while ready, and its list entry is skipped.
		_, err = q.Upsert(ctx, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("now")})
		require.NoError(t, err)
		_, err = q.Upsert(ctx, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("now, again")})
		require.NoError(t, err)
		assert.Equal(t, StateReady, get("reminder-1").State)
		job, err := q.Pop(ctx, "remind", 0)
		require.NoError(t, err)
		assert.Equal(t, "now, again", string(job.Body))
		_, err = q.Pop(ctx, "remind", 0)
		assert.ErrorIs(t, err, ErrNoJob, "replacing a ready job keeps one entry")

		// Finished, its ID taken by the dedup window: Push leaves it, Upsert
		// creates it again.
		require.NoError(t, q.Finish(ctx, job.ID))
		pushedAgain, err := pushWithResult(ctx, q, &Job{ID: "reminder-1", Topic: "remind"})
		require.NoError(t, err)
		assert.True(t, pushedAgain.Existed)
		res, err = q.Upsert(ctx, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("new day"), Delay: time.Hour})
		require.NoError(t, err)
		assert.False(t, res.Existed)
		assert.Equal(t, "new day", string(get("reminder-1").Body))

		// A ready job moved to another topic leaves nothing in the old list.
		_, err = q.Upsert(ctx, &Job{ID: "reminder-2", Topic: "remind"})
		require.NoError(t, err)
		_, err = q.Upsert(ctx, &Job{ID: "reminder-2", Topic: "other"})
		require.NoError(t, err)
		_, err = q.Pop(ctx, "remind", 0)
		assert.ErrorIs(t, err, ErrNoJob)
		job, err = q.Pop(ctx, "other", 0)
		require.NoError(t, err)
		assert.Equal(t, "reminder-2", job.ID)

		for _, bad := range []*Job{nil, {Topic: "t"}, {ID: "~x", Topic: "t"}, {ID: "a", Topic: "bad topic"}} {
			_, err := q.Upsert(ctx, bad)
			assert.ErrorIs(t, err, ErrInvalidJob)
		}
	})
}

func TestUpsertReplacesAReservedJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		pushed(t, q, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("old")})
		held, err := q.Pop(ctx, "remind", 0)
		require.NoError(t, err)

		res, err := q.Upsert(ctx, &Job{ID: "reminder-1", Topic: "remind", Body: []byte("new")})
		require.NoError(t, err)
		assert.True(t, res.Existed)

		assert.ErrorIs(t, q.Finish(ctx, held.ID), ErrReservationLost, "the old delivery cannot settle")
		assert.ErrorIs(t, q.Retry(ctx, held, errors.New("x")), ErrReservationLost)
		next, err := q.Pop(ctx, "remind", 0)
		require.NoError(t, err, "the new job is the next delivery")
		assert.Equal(t, "new", string(next.Body))
		assert.Equal(t, 1, next.Attempts)
		require.NoError(t, q.Finish(ctx, next.ID))
		_, err = q.Pop(ctx, "remind", 0)
		assert.ErrorIs(t, err, ErrNoJob, "delivered once")
	})
}

// A push script call carries at most maxPushChunk jobs and maxPushBytes of
// them, so that large bodies never hold Redis for long in one call; a job
// larger than that goes alone.
func TestPushCallsAreBoundedInJobsAndBytes(t *testing.T) {
	type job struct{ bucket, size int }
	var jobs []job
	for i := range 2500 {
		jobs = append(jobs, job{i % 2, 10})
	}
	jobs = append(jobs, job{0, 600 << 10}, job{0, 600 << 10}, job{0, 3 << 20}, job{0, 10})
	chunks := byBucketSized(jobs, func(j job) int { return j.bucket }, maxPushChunk,
		func(j job) int { return j.size }, maxPushBytes)
	seen := 0
	for _, c := range chunks {
		seen += len(c)
		assert.LessOrEqual(t, len(c), maxPushChunk)
		total := 0
		for _, j := range c {
			total += j.size
			assert.Equal(t, c[0].bucket, j.bucket)
		}
		if len(c) > 1 {
			assert.LessOrEqual(t, total, maxPushBytes)
		}
	}
	assert.Equal(t, len(jobs), seen)
	// Bucket 0: 1,000 small; 250 small and one of 600 KiB; the other alone;
	// 3 MiB alone; the last small one. Bucket 1: 1,000 and 250.
	assert.Len(t, chunks, 7)
}

func TestUpsertReplacesADeadJobAsANewPendingOne(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		pushed(t, q, &Job{ID: "r1", Topic: "remind", MaxAttempts: 1, Body: []byte("old")})
		job, err := q.Pop(ctx, "remind", 0)
		require.NoError(t, err)
		require.NoError(t, q.Retry(ctx, job, errors.New("provider down")))
		got, err := q.Get(ctx, "r1")
		require.NoError(t, err)
		require.Equal(t, StateDead, got.State)

		res, err := q.Upsert(ctx, &Job{ID: "r1", Topic: "remind", Body: []byte("new"), Delay: time.Hour})
		require.NoError(t, err)
		assert.True(t, res.Existed)
		got, err = q.Get(ctx, "r1")
		require.NoError(t, err)
		assert.Equal(t, StateDelayed, got.State)
		assert.Equal(t, "new", string(got.Body))
		assert.Zero(t, got.Attempts)
		assert.Empty(t, got.LastError)
		c, err := q.Counts(ctx, "remind")
		require.NoError(t, err)
		assert.Equal(t, Counts{Delayed: 1}, c, "out of the dead letters")

		// Dead again, and made ready at once.
		require.NoError(t, q.RescheduleIn(ctx, "r1", 0))
		job, err = q.Pop(ctx, "remind", 0)
		require.NoError(t, err)
		require.NoError(t, q.Retry(ctx, job, errors.New("again")))
		_, err = q.Upsert(ctx, &Job{ID: "r1", Topic: "remind", Body: []byte("now")})
		require.NoError(t, err)
		job, err = q.Pop(ctx, "remind", 0)
		require.NoError(t, err)
		assert.Equal(t, "now", string(job.Body))
	})
}

// A job whose ID another queue generated is refused, not pushed under a
// new ID or mistaken for a job of this queue's that took its ID.
func TestAJobOfAnotherQueuesGeneratedIDIsRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		qa := newQueue(t, be.client, WithName(uniqueName(t)+"a"))
		qb := newQueue(t, be.client, WithName(uniqueName(t)+"b"))
		id := pushed(t, qa, &Job{Topic: "t"})
		pushed(t, qb, &Job{Topic: "t"})
		job, err := qa.Get(ctx, id)
		require.NoError(t, err)
		before := keysOfQueues(t, be.client, qa.opts.name, qb.opts.name)
		_, err = qb.Push(ctx, job)
		assert.ErrorIs(t, err, ErrInvalidID)
		_, err = qb.Upsert(ctx, job)
		assert.ErrorIs(t, err, ErrInvalidJob)
		assert.Equal(t, id, job.ID)
		assert.Equal(t, before, keysOfQueues(t, be.client, qa.opts.name, qb.opts.name), "nothing written")
		// Pushed again where it was made, it is the same job.
		res, err := qa.PushMany(ctx, []*Job{job})
		require.NoError(t, err)
		assert.Equal(t, id, res[0].ID)
		job.ID = ""
		other, err := qb.Push(ctx, job)
		require.NoError(t, err, "without its ID, a new job")
		assert.NotEqual(t, id, other)
	})
}
