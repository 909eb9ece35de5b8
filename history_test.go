package delayqueue

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// historyQueues opens two instances of one queue, as two processes would,
// with their tallies on as Start turns them on, but no sampler running:
// the test calls sampleHistory itself.
func historyQueues(t *testing.T, be backend, every time.Duration) (a, b *DelayQueue) {
	name := uniqueName(t)
	a = newQueue(t, be.client, WithName(name), WithHistory(every))
	b = newQueue(t, be.client, WithName(name), WithHistory(every))
	a.tally.on.Store(true)
	b.tally.on.Store(true)
	return a, b
}

// finishOne pushes a job to topic, pops it and finishes it.
func finishOne(t *testing.T, q *DelayQueue, topic string) {
	t.Helper()
	ctx := context.Background()
	pushed(t, q, &Job{Topic: topic})
	job, err := q.Pop(ctx, topic, 0)
	require.NoError(t, err)
	require.NoError(t, q.Finish(ctx, job.ID))
}

func TestHistoryOneSamplePerInterval(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		a, b := historyQueues(t, be, time.Hour)
		if be.mini != nil {
			be.mini.SetTime(time.UnixMilli(10 * time.Hour.Milliseconds()).Add(time.Minute))
		}
		finishOne(t, a, "mail")
		finishOne(t, b, "mail")
		finishOne(t, b, "sms")
		pushed(t, a, &Job{Topic: "mail", Delay: time.Hour})
		pushed(t, a, &Job{Topic: "mail"})

		_, err := a.sampleHistory(ctx)
		require.NoError(t, err)
		_, err = b.sampleHistory(ctx) // b's tallies wait for the next sample
		require.NoError(t, err)

		all, err := b.History(ctx, "")
		require.NoError(t, err)
		mail, err := b.History(ctx, "mail")
		require.NoError(t, err)
		require.Len(t, all, 1, "two processes, one interval: one sample")
		require.Len(t, mail, 1)
		assert.Equal(t, 1, mail[0].Delayed)
		assert.Equal(t, 1, mail[0].Ready)
		assert.Equal(t, 1, mail[0].Finished, "a's own tally")
		assert.Equal(t, 1, mail[0].Reservations)
		assert.Equal(t, time.Hour, mail[0].Span)
		assert.Equal(t, 2, all[0].Delayed+all[0].Ready)
		sms, err := a.History(ctx, "sms")
		require.NoError(t, err)
		assert.Empty(t, sms, "b flushed its tally after a claimed the sample")

		if be.mini != nil {
			be.mini.SetTime(time.UnixMilli(11 * time.Hour.Milliseconds()).Add(time.Minute))
			_, err = a.sampleHistory(ctx)
			require.NoError(t, err)
			all, err = a.History(ctx, "")
			require.NoError(t, err)
			require.Len(t, all, 2, "the next interval: the next sample")
			assert.Equal(t, 2, all[1].Finished, "b's tallies of the interval before")
			assert.Equal(t, time.Hour, all[1].Span)
			sms, err = a.History(ctx, "sms")
			require.NoError(t, err)
			require.Len(t, sms, 1)
			assert.Equal(t, 1, sms[0].Finished)
		}
	})
}

// A quiet queue (no job reserved, finished or buried since the last
// sample) is sampled once per historyQuiet intervals, not every interval:
// reading every bucket's counts would be most of an idle queue's cost.
// Activity brings the next interval's sample.
func TestHistoryOfAQuietQueueIsSampledLessOften(t *testing.T) {
	m := miniredisBackend(t)
	ctx := context.Background()
	q, _ := historyQueues(t, m, time.Second)
	start := time.UnixMilli(1_000_000_000_000)
	var wait time.Duration
	sampleAt := func(i int) []Sample {
		t.Helper()
		m.mini.SetTime(start.Add(time.Duration(i) * time.Second))
		var err error
		wait, err = q.sampleHistory(ctx)
		require.NoError(t, err)
		all, err := q.History(ctx, "")
		require.NoError(t, err)
		return all
	}
	pushed(t, q, &Job{Topic: "mail", Delay: time.Hour})
	require.Len(t, sampleAt(0), 1, "the first sample")
	for i := 1; i < historyQuiet; i++ {
		require.Len(t, sampleAt(i), 1, "interval %d of a quiet queue: no sample", i)
		assert.GreaterOrEqual(t, wait, time.Duration(historyQuiet-i)*time.Second,
			"an idle process calls again when the quiet queue's sample is due")
	}
	all := sampleAt(historyQuiet)
	require.Len(t, all, 2, "a quiet queue is sampled every %d intervals", historyQuiet)
	assert.Equal(t, historyQuiet*time.Second, all[1].Span)
	assert.Equal(t, 1, all[1].Delayed)

	finishOne(t, q, "sms")
	all = sampleAt(historyQuiet + 1)
	require.Len(t, all, 3, "a finished job: the next interval is sampled")
	assert.Equal(t, 1, all[2].Finished)
	assert.Equal(t, time.Second, all[2].Span)
}

func TestHistoryIsBounded(t *testing.T) {
	m := miniredisBackend(t)
	ctx := context.Background()
	q, _ := historyQueues(t, m, time.Second)
	pushed(t, q, &Job{Topic: "mail", Delay: 24 * time.Hour})
	start := time.UnixMilli(1_000_000_000_000)
	for i := range historyPoints + 40 {
		m.mini.SetTime(start.Add(time.Duration(i) * time.Second))
		finishOne(t, q, "sms")
		_, err := q.sampleHistory(ctx)
		require.NoError(t, err)
	}
	hk := q.keys.history()
	for _, key := range []string{hk.all, hk.series("mail"), hk.series("sms")} {
		n, err := m.client.LLen(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(historyPoints), n, key)
		assert.Equal(t, historyPoints*time.Second, m.mini.TTL(key), "a series lives as long as it covers")
	}
	all, err := q.History(ctx, "")
	require.NoError(t, err)
	assert.Equal(t, start.Add((historyPoints+39)*time.Second), all[len(all)-1].At)
	assert.Equal(t, start.Add(40*time.Second), all[0].At, "the oldest went")
	m.mini.FastForward(historyPoints * time.Second)
	all, err = q.History(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, all, "no sample for 360 intervals: no history left")
}

// miniredisBackend is a miniredis of the test's own.
func miniredisBackend(t *testing.T) backend {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return backend{client: c, mini: m}
}

func TestHistoryOfAStartedProcessReadByAnother(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		defer verifyNoLeaks(t)()
		ctx := context.Background()
		name := uniqueName(t)
		worker := newQueue(t, be.client, WithName(name), WithHistory(time.Second))
		api := newQueue(t, be.client, WithName(name), WithoutInstance())
		pushed(t, api, &Job{ID: "a", Topic: "mail", Delay: time.Hour})
		samples, err := api.History(ctx, "mail")
		require.NoError(t, err)
		assert.Empty(t, samples, "no started process: no history")
		startQueue(t, worker)
		require.Eventually(t, func() bool {
			samples, err = api.History(ctx, "mail")
			return err == nil && len(samples) > 0
		}, 10*time.Second, 20*time.Millisecond)
		assert.Equal(t, 1, samples[0].Delayed)
		closeQueue(t, worker)
	})
}

func TestHistoryOption(t *testing.T) {
	c := miniredisClient(t)
	for _, d := range []time.Duration{-time.Second, time.Millisecond, 999 * time.Millisecond, time.Second + time.Microsecond} {
		_, err := New(c, WithHistory(d))
		assert.ErrorIs(t, err, ErrInvalidOption, "%v", d)
	}
	q := newQueue(t, c, WithHistory(0))
	startQueue(t, q)
	assert.False(t, q.tally.on.Load(), "no history: no tally")
	_, err := q.History(context.Background(), "bad topic\n")
	assert.ErrorIs(t, err, ErrInvalidTopic)
}

// TestMeasureHistory prints what the history costs a real redis-server:
// the commands (and script calls) per second of 1 and of 4 started
// processes of one idle queue, with the history on (every second) and
// off, and how many samples each wrote. Run with
//
//	DQ_MEASURE=1 go test -run TestMeasureHistory -v .
func TestMeasureHistory(t *testing.T) {
	if os.Getenv("DQ_MEASURE") != "1" {
		t.Skip("set DQ_MEASURE=1 to measure")
	}
	ctx := context.Background()
	s := redistest.Start(t)
	c := s.Client(t)
	const run = 10 * time.Second
	for _, every := range []time.Duration{0, time.Second} {
		for _, procs := range []int{1, 4} {
			name := fmt.Sprintf("measure-%v-%d", every, procs)
			qs := make([]*DelayQueue, procs)
			for i := range qs {
				qs[i] = newQueue(t, c, WithName(name), WithHistory(every), WithBuckets(4))
			}
			for i := range 10 {
				pushed(t, qs[0], &Job{Topic: fmt.Sprintf("t%d", i), Delay: time.Hour})
			}
			before := commandCalls(t, c)
			for _, q := range qs {
				startQueue(t, q)
			}
			timer := time.NewTimer(run)
			<-timer.C
			after := commandCalls(t, c)
			for _, q := range qs {
				closeQueue(t, q)
			}
			var total int64
			for cmd, n := range after {
				total += n - before[cmd]
			}
			samples, err := c.LLen(ctx, qs[0].keys.history().all).Result()
			require.NoError(t, err)
			t.Logf("history every %v, %d started processes, 4 buckets, 10 topics: %.1f commands/s, %.1f script calls/s, %d samples in %v",
				every, procs, float64(total)/run.Seconds(), float64(scriptCalls(after)-scriptCalls(before))/run.Seconds(), samples, run)
		}
	}
}
