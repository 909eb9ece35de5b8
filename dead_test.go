package delayqueue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// killJobs pushes n jobs with one attempt each and fails them all.
func killJobs(t *testing.T, q *DelayQueue, topic string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		ids = append(ids, pushed(t, q, &Job{Topic: topic, MaxAttempts: 1, Body: []byte(fmt.Sprint(i))}))
	}
	for range n {
		job, err := q.Pop(ctx, topic, time.Minute)
		require.NoError(t, err)
		require.NoError(t, q.Retry(ctx, job, fmt.Errorf("failed %s", job.Body)))
	}
	return ids
}

func TestDeadLetters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		ids := killJobs(t, q, "t", 5)
		killJobs(t, q, "other", 2)

		dead, err := listJobs(ctx, q, "t", StateDead, 10)
		require.NoError(t, err)
		require.Len(t, dead, 5)
		for _, job := range dead {
			assert.Equal(t, StateDead, job.State)
			assert.Equal(t, "failed "+string(job.Body), job.LastError)
		}
		few, err := listJobs(ctx, q, "t", StateDead, 2)
		require.NoError(t, err)
		assert.Len(t, few, 2)

		require.NoError(t, q.RequeueDead(ctx, ids[0]))
		assert.ErrorIs(t, q.RequeueDead(ctx, ids[0]), ErrNotFound, "it is no longer dead")
		job, err := q.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		assert.Equal(t, ids[0], job.ID)
		assert.Equal(t, 1, job.Attempts, "a requeued job starts its attempts again")
		require.NoError(t, q.Finish(ctx, job.ID))

		n, err := q.RequeueAllDead(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 4, n)
		seen := consume(t, []*DelayQueue{q}, "t", 1, 4)
		assert.Len(t, seen, 4)

		n, err = q.PurgeDead(ctx, "other")
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		dead, err = listJobs(ctx, q, "other", StateDead, 10)
		require.NoError(t, err)
		assert.Empty(t, dead)
		_, err = listJobs(ctx, q, "", StateDead, 10)
		assert.ErrorIs(t, err, ErrInvalidTopic)
	})
}

func TestDeadLettersAreKeptUntilTheirRetention(t *testing.T) {
	ctx := context.Background()
	q, _, _, advance := clockQueue(t, WithDeadRetention(time.Hour))
	killJobs(t, q, "t", 3)
	advance(59 * time.Minute)
	n, err := q.trimDead(ctx, 0)
	require.NoError(t, err)
	assert.Zero(t, n, "kept within the retention")
	advance(time.Minute)
	n, err = q.trimDead(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	dead, err := listJobs(ctx, q, "t", StateDead, 10)
	require.NoError(t, err)
	assert.Empty(t, dead)
}

func TestHandlerDeletesExpiredDeadLetters(t *testing.T) {
	ctx := context.Background()
	c := miniredisClient(t)
	q := newQueue(t, c, WithDeadRetention(time.Millisecond), WithSafetyPoll(10*time.Millisecond))
	killJobs(t, q, "t", 3)
	startQueue(t, q)
	require.Eventually(t, func() bool {
		dead, err := listJobs(ctx, q, "t", StateDead, 10)
		return err == nil && len(dead) == 0
	}, 10*time.Second, 5*time.Millisecond)
}

// A look deletes every dead job past the retention, batch after batch, not
// one batch of them: dead jobs that come faster than a batch per safety
// poll would pile up.
func TestDeadLettersPastTheirRetentionGoInOneLook(t *testing.T) {
	ctx := context.Background()
	q, _, _, advance := clockQueue(t, WithDeadRetention(time.Minute), WithBuckets(1))
	const n = 2*deadBatch + 100
	killJobs(t, q, "t", n)
	advance(time.Minute)
	got, err := q.trimDead(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, n, got)
	c, err := q.Counts(ctx, "t")
	require.NoError(t, err)
	assert.Zero(t, c.Dead)
}

// RequeueDead requeues a job under the topic it is dead in when the script
// runs, whatever topic the caller read before: a job replaced and dead
// again under another topic in between is counted there, once.
func TestRequeueDeadFollowsTheJobsTopicNow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		die := func(topic string) {
			t.Helper()
			_, err := q.Upsert(ctx, &Job{ID: "j", Topic: topic, MaxAttempts: 1})
			require.NoError(t, err)
			job, err := q.Pop(ctx, topic, time.Minute)
			require.NoError(t, err)
			require.NoError(t, q.Retry(ctx, job, fmt.Errorf("boom")))
		}
		die("a")
		read, err := q.Get(ctx, "j") // what RequeueDead reads first
		require.NoError(t, err)
		die("b")
		n, err := q.requeue(ctx, bucketOf("j", q.opts.buckets), read.Topic, "j")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		job, err := q.Get(ctx, "j")
		require.NoError(t, err)
		assert.Equal(t, StateReady, job.State)
		assert.Equal(t, "b", job.Topic)
		for topic, ready := range map[string]int{"a": 0, "b": 1} {
			c, err := q.Counts(ctx, topic)
			require.NoError(t, err)
			assert.Equal(t, [4]int{0, ready, 0, 0}, [4]int{c.Delayed, c.Ready, c.Reserved, c.Dead}, topic)
		}
		dead, err := listJobs(ctx, q, "b", StateDead, 10)
		require.NoError(t, err)
		assert.Empty(t, dead)
	})
}
