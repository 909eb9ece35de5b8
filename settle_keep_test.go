package delayqueue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConsumeRunsAJobLongerThanThreeTTRsOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		startQueue(t, q) // a job whose reservation ran out would come back
		const ttr = 200 * time.Millisecond
		id := pushed(t, q, &Job{Topic: "t", TTR: ttr})
		var calls atomic.Int64
		var finished atomic.Bool
		h := func(ctx context.Context, job *Job) error {
			calls.Add(1)
			if err := work(ctx, 3*ttr+ttr/2); err != nil {
				return err
			}
			finished.Store(true)
			return nil
		}
		consumeUntil(t, q, h, ConsumeOptions{Concurrency: 4}, func() bool {
			_, err := q.Get(ctx, id)
			return finished.Load() && errors.Is(err, ErrNotFound)
		})
		assert.Equal(t, int64(1), calls.Load(), "the handler ran once, and its success finished the job")
	})
}

// scriptCounter counts a client's calls of one script, pipelined or not,
// that ran: not those that found the server without the script or its
// function, and were sent again.
type scriptCounter struct {
	script *luaScript // counted in any of its forms
	n      atomic.Int64
}

func (s *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		s.count(cmd, err)
		return err
	}
}

func (s *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			s.count(cmd, cmd.Err())
		}
		return err
	}
}

// count counts cmd, which ended in err (a hook sees a call's error before
// go-redis sets it on the call).
func (s *scriptCounter) count(cmd redis.Cmder, err error) {
	if runsScript(cmd, s.script) && !notRun(err) {
		s.n.Add(1)
	}
}

func TestConsumeExtendsManyReservationsInOneCall(t *testing.T) {
	ctx := context.Background()
	c := redistest.Shared(t).Client(t)
	touches := &scriptCounter{script: scriptTouch}
	c.AddHook(touches)
	q := newQueue(t, c, WithBuckets(1))
	startQueue(t, q)
	const n, ttr, run = 20, 300 * time.Millisecond, 1500 * time.Millisecond
	jobs := make([]*Job, n)
	for i := range jobs {
		jobs[i] = &Job{Topic: "t", TTR: ttr}
	}
	_, err := q.PushMany(ctx, jobs)
	require.NoError(t, err)
	var calls, done atomic.Int64
	h := func(ctx context.Context, job *Job) error {
		calls.Add(1)
		if err := work(ctx, run); err != nil {
			return err
		}
		done.Add(1)
		return nil
	}
	consumeUntil(t, q, h, ConsumeOptions{Concurrency: n}, func() bool { return done.Load() == n })
	// One job at a time would take at least 3 extensions per TTR each:
	// n * run / (ttr / 3) = 100 calls.
	t.Logf("EXTEND %d jobs running %v with TTR %v: %d touch calls", n, run, ttr, touches.n.Load())
	assert.Equal(t, int64(n), calls.Load(), "each job ran once")
	assert.LessOrEqual(t, touches.n.Load(), int64(n*run/(ttr/3)/4), "the extensions of jobs running together share calls")
	st, err := readKeyStats(ctx, q, "t")
	require.NoError(t, err)
	assert.Zero(t, st.Jobs)
}

func TestMaxRunTimeCountsFromTheHandlersStart(t *testing.T) {
	c := miniredisClient(t)
	q := newQueue(t, c, WithSafetyPoll(time.Hour))
	const maxRun = time.Second
	left := make(chan time.Duration, 1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, "t", func(ctx context.Context, job *Job) error {
			deadline, _ := ctx.Deadline()
			left <- time.Until(deadline)
			return nil
		}, ConsumeOptions{MaxRunTime: maxRun})
	}()
	// The consumer waits a while for its first job, longer than MaxRunTime.
	idle := time.NewTimer(2 * maxRun)
	<-idle.C
	pushed(t, q, &Job{Topic: "t"})
	got := <-left
	cancel()
	require.NoError(t, <-errc)
	assert.Greater(t, got, maxRun/2, "the handler gets its whole MaxRunTime, not what the wait left")
}

// A running job found gone by the keeper ends its handler's ctx with the
// cause that says why: removed while reserved (ErrNotFound), or gone after
// its reservation ran out, to another consumer that finished it
// (ErrReservationLost).
func TestTheKeeperSaysWhyARunningJobIsGone(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, miniredisClient(t))
	for name, tc := range map[string]struct {
		until time.Time
		want  error
	}{
		"removed while reserved":           {time.Now().Add(time.Hour), ErrNotFound},
		"gone after its reservation ended": {time.Now().Add(-time.Second), ErrReservationLost},
	} {
		pushed(t, q, &Job{Topic: "t", TTR: time.Hour})
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Remove(ctx, job.ID))
		var cause error
		c := &consumer{q: q, running: map[*Job]*running{}}
		ref := *job
		ref.ReservedUntil = tc.until
		c.running[job] = &running{ref: &ref, cancel: func(err error) { cause = err },
			renewed: time.Now().Add(-time.Hour), stop: time.Now().Add(time.Hour)}
		require.NoError(t, c.extend(ctx))
		assert.ErrorIs(t, cause, tc.want, name)
	}
}
