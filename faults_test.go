package delayqueue

// Fault tests: real redis-server processes, consumers and movers in child
// processes killed or paused with signals, and a proxy that cuts Redis off.
// Each logs its figures on a line starting with "FAULT". DQ_SOAK=1 runs them
// at full scale (100,000 and 1,000,000 jobs); the default scale keeps
// `go test ./...` quick.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/dqueue/delayqueue/internal/tcpproxy"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Child processes: the test binary runs itself with DQ_HELPER set, and
// TestMain hands over to runHelper before any test runs.
const helperEnv = "DQ_HELPER"

func TestFaultConsumerKilledHoldingJobs(t *testing.T) {
	const n = 1000
	s := redistest.Start(t)
	c := s.Client(t)
	name := uniqueName(t)
	q := newQueue(t, c, WithName(name))
	ids := pushN(t, q, n, func(int) *Job { return &Job{Topic: "t", TTR: time.Second} })

	holder := startChild(t, "hold", s.Addr, name, "DQ_N="+strconv.Itoa(n))
	holder.expect(t, "held 1000")
	holder.signal(t, syscall.SIGKILL)

	startQueue(t, q)
	tl := deliverAll(t, q, ids, time.Minute)
	tl.report(t, "consumer SIGKILLed holding 1000 reserved jobs")
}

func TestFaultRedisKilledMidPushWithAOF(t *testing.T) {
	s := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	name := uniqueName(t)
	q := newQueue(t, c, WithName(name))

	var mu sync.Mutex
	var acked []string
	var attempted atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				attempted.Add(1)
				if _, err := q.Push(ctx, &Job{ID: id, Topic: "t"}); err == nil {
					mu.Lock()
					acked = append(acked, id)
					mu.Unlock()
				}
			}
		}()
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= scale(2000, 20000)
	}, time.Minute, time.Millisecond)
	s.Kill() // in the middle of pushes
	stop()
	wg.Wait()
	require.NoError(t, s.Restart())

	mu.Lock()
	defer mu.Unlock()
	tl := deliverAll(t, newQueue(t, s.Client(t), WithName(name)), acked, time.Minute)
	t.Logf("FAULT redis SIGKILLed mid-push (appendfsync always): push calls=%d acknowledged=%d", attempted.Load(), len(acked))
	tl.report(t, "redis SIGKILLed mid-push and restarted from its AOF")
}

func TestFaultLeaseHolderPausedPastItsLease(t *testing.T) {
	n := scale(20_000, 100_000)
	s := redistest.Start(t)
	c := s.Client(t)
	name := uniqueName(t)
	const lease = 500 * time.Millisecond
	q := newQueue(t, c, WithName(name), WithLease(lease))

	holder := startChild(t, "mover", s.Addr, name, "DQ_LEASE="+lease.String())
	holder.expect(t, "started")
	locks := func() []string {
		var vals []string
		for b := range q.opts.buckets {
			v, _ := c.Get(context.Background(), q.keys.bucket(b).lock).Result()
			vals = append(vals, v)
		}
		return vals
	}
	require.Eventually(t, func() bool { return !slices.Contains(locks(), "") }, 10*time.Second, time.Millisecond,
		"the child holds every bucket")
	childTokens := locks()

	due := time.Now().Add(time.Second)
	ids := pushN(t, q, n, func(i int) *Job {
		return &Job{Topic: "t", RunAt: due.Add(time.Duration(i%3000) * time.Millisecond), TTR: time.Hour}
	})
	startQueue(t, q)

	holder.signal(t, syscall.SIGSTOP) // paused while it holds the leases
	require.Eventually(t, func() bool {
		for b, v := range locks() {
			if !strings.HasPrefix(v, q.handlers[b].lease.token+" ") {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "this process takes every bucket over")
	holder.signal(t, syscall.SIGCONT) // resumes, believing it still holds them

	moves := movedIDs(t, q, c, "t")
	t.Logf("FAULT lease holder SIGSTOPped past its lease: jobs=%d IDs in ready lists=%d", n, moves)
	assert.Equal(t, int64(n), moves, "every job was moved exactly once")
	tl := deliverAll(t, q, ids, 2*time.Minute)
	assert.NotEqual(t, childTokens, locks())
	tl.report(t, "lease holder SIGSTOPped past its lease")
}

// movedIDs waits until every bucket of q is empty, none of its jobs having
// been popped, and counts the IDs in topic's ready lists: as many as jobs
// when each was moved once.
func movedIDs(t *testing.T, q *DelayQueue, c redis.UniversalClient, topic string) int64 {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		for b := range q.opts.buckets {
			if n, err := c.ZCard(ctx, q.keys.bucket(b).zset).Result(); err != nil || n > 0 {
				return false
			}
		}
		return true
	}, 2*time.Minute, 10*time.Millisecond, "every job is moved")
	var ids int64
	for b := range q.opts.buckets {
		n, err := c.LLen(ctx, q.keys.bucket(b).ready(topic)).Result()
		require.NoError(t, err)
		ids += n
	}
	return ids
}

func TestFaultFiveProcessesContendForEveryBucket(t *testing.T) {
	n := scale(20_000, 100_000)
	s := redistest.Start(t)
	c := s.Client(t)
	name := uniqueName(t)
	q := newQueue(t, c, WithName(name))
	for i := range 5 {
		mode := "mover"
		if i >= 2 {
			mode = "churn" // these come and go, so buckets change hands
		}
		startChild(t, mode, s.Addr, name, "DQ_LEASE=200ms").expect(t, "started")
	}
	due := time.Now().Add(500 * time.Millisecond)
	ids := pushN(t, q, n, func(i int) *Job {
		return &Job{Topic: "t", RunAt: due.Add(time.Duration(i%2000) * time.Millisecond), TTR: time.Hour}
	})
	moves := movedIDs(t, q, c, "t")
	t.Logf("FAULT five processes contending: jobs=%d IDs in ready lists=%d", n, moves)
	assert.Equal(t, int64(n), moves, "every job was moved exactly once")
	tl := deliverAll(t, q, ids, 2*time.Minute)
	tl.report(t, "five processes contending for every bucket")
}

func TestFaultManyJobsDueInTheSameMillisecond(t *testing.T) {
	const n = 10_000
	s := redistest.Shared(t)
	q := newQueue(t, s.Client(t), WithDefaultTTR(time.Hour))
	startQueue(t, q)
	due := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	ids := pushN(t, q, n, func(int) *Job { return &Job{Topic: "t", RunAt: due} })
	tl := deliverAll(t, q, ids, time.Minute)
	tl.report(t, "10,000 jobs due in the same millisecond")
}

func TestFaultHugeBacklogDrainsInShortScriptCalls(t *testing.T) {
	n := scale(100_000, 1_000_000)
	ctx := context.Background()
	// SLOWLOG keeps every command of 1 ms or more.
	s := redistest.Start(t, "--slowlog-log-slower-than", "1000", "--slowlog-max-len", "100000")
	c := s.Client(t)
	// Each move call reports the jobs it made ready.
	var mu sync.Mutex
	var moves []int
	q := newQueue(t, c, WithBuckets(8), WithObserver(ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventMoved {
			mu.Lock()
			moves = append(moves, e.Count)
			mu.Unlock()
		}
	})))
	due := time.Now().Add(time.Duration(n/20_000+5) * time.Second) // after the pushes
	pushN(t, q, n, func(int) *Job { return &Job{Topic: "t", RunAt: due, TTR: time.Hour} })
	require.True(t, time.Now().Before(due), "pushing took longer than planned")
	require.NoError(t, c.Do(ctx, "SLOWLOG", "RESET").Err())

	startQueue(t, q)
	require.Eventually(t, func() bool {
		var ready int64
		for b := range q.opts.buckets {
			ready += c.LLen(ctx, q.keys.bucket(b).ready("t")).Val()
		}
		return ready == int64(n)
	}, 5*time.Minute, 10*time.Millisecond, "every job reaches its ready list")
	drained := time.Since(due)

	// The bound on a call is its work: no call moves more than a batch,
	// however many jobs are due, so a backlog drains in many short calls
	// and Redis serves its other clients between them.
	mu.Lock()
	sum, most := 0, 0
	for _, m := range moves {
		sum, most = sum+m, max(most, m)
	}
	calls := len(moves)
	mu.Unlock()
	assert.Equal(t, n, sum, "every job moved once")
	assert.LessOrEqual(t, most, q.opts.batch, "no call moves more than a batch")
	assert.GreaterOrEqual(t, calls, n/q.opts.batch)

	// How long the calls took is a figure, not a bound: SLOWLOG times a
	// call on the wall clock, so a Redis that loses its core to another
	// process mid-call is charged for the wait, and on a shared machine
	// that can be many times the call's work. BENCHMARKS.md quotes the
	// times from dqbench's S7.
	slow, err := c.SlowLogGet(ctx, -1).Result()
	require.NoError(t, err)
	var times []time.Duration
	for _, e := range slow {
		if len(e.Args) > 0 && (strings.HasPrefix(strings.ToLower(e.Args[0]), "eval") || strings.ToLower(e.Args[0]) == "fcall") {
			times = append(times, e.Duration) // not SLOWLOG RESET and the like
		}
	}
	slices.Sort(times)
	var p99, longest time.Duration
	if len(times) > 0 {
		p99, longest = times[len(times)*99/100], times[len(times)-1]
	}
	t.Logf("FAULT %d jobs due at once: drained %v after their due time in %d move calls of at most %d jobs; calls of 1 ms or more=%d, p99 of those=%v, longest=%v (SLOWLOG)",
		n, drained.Round(time.Millisecond), calls, most, len(times), p99, longest)
}

func TestFaultRedisUnreachableAtStartAndMidway(t *testing.T) {
	s := redistest.Start(t)
	proxy, err := tcpproxy.Start(s.Addr, false)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	name := uniqueName(t)

	// Unreachable at start: New says so, and works once Redis is back.
	_, err = New(c, WithName(name))
	require.Error(t, err)
	t.Logf("New with Redis unreachable: %v", err)
	proxy.SetUp(true)
	q, err := New(c, WithName(name), WithLogger(discard), WithSafetyPoll(time.Second))
	require.NoError(t, err)
	startQueue(t, q)

	var acked []string
	push := func(i int) {
		id, err := q.Push(context.Background(), &Job{ID: fmt.Sprintf("job-%d", i), Topic: "t", Delay: 300 * time.Millisecond})
		if err == nil {
			acked = append(acked, id)
		}
	}
	for i := range 100 {
		push(i)
	}
	proxy.SetUp(false) // midway: jobs are due while Redis is unreachable
	failed := 0
	for i := 100; i < 120; i++ {
		n := len(acked)
		push(i)
		if len(acked) == n {
			failed++
		}
	}
	assert.Equal(t, 20, failed, "pushes while Redis is unreachable return errors")
	unreachable := time.NewTimer(time.Second)
	<-unreachable.C // stay away past the jobs' due time and a few handler retries
	proxy.SetUp(true)
	for i := 120; i < 200; i++ {
		push(i)
	}

	tl := deliverAll(t, q, acked, time.Minute)
	tl.report(t, "redis unreachable at start and midway")

	proxy.SetUp(false) // Close must not hang on an unreachable Redis
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelClose()
	start := time.Now()
	err = q.Close(closeCtx)
	t.Logf("Close with Redis unreachable returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	assert.NoError(t, closeCtx.Err(), "Close returned within its context")
}

// A lease holder that dies (SIGKILL) or freezes (SIGSTOP) costs its
// buckets' due jobs about takeoverGrace, not the rest of its lease: the
// standby, another started process, takes the buckets over when their jobs
// are overdue and the holder has moved nothing for as long.
func TestFaultALostLeaseHolderIsTakenOverLongBeforeItsLeaseRunsOut(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"killed": syscall.SIGKILL, "frozen": syscall.SIGSTOP} {
		t.Run(name, func(t *testing.T) {
			s := redistest.Start(t)
			c := s.Client(t)
			queue := uniqueName(t)
			const lease = time.Minute
			holder := startChild(t, "mover", s.Addr, queue, "DQ_LEASE="+lease.String())
			holder.expect(t, "started")
			var late lateness
			q := newQueue(t, c, WithName(queue), WithLease(lease), WithObserver(&late))
			lock := func(bk bucketKeys) string { return bk.lock }
			require.Eventually(t, func() bool { return !slices.Contains(leaseOwners(c, q, lock), "") },
				10*time.Second, time.Millisecond, "the child holds every bucket")
			startQueue(t, q)
			require.Eventually(t, func() bool { return ownsAll(q, leaseOwners(c, q, func(bk bucketKeys) string { return bk.standby })) },
				10*time.Second, time.Millisecond, "this process stands by for every bucket")

			n := scale(1000, 10_000)
			due := time.Now().Add(time.Second)
			ids := pushN(t, q, n, func(i int) *Job {
				return &Job{Topic: "t", RunAt: due.Add(time.Duration(i%2000) * time.Millisecond)}
			})
			killed := time.Now()
			holder.signal(t, sig)
			if sig == syscall.SIGSTOP {
				t.Cleanup(func() { _ = holder.cmd.Process.Signal(syscall.SIGCONT) })
			}
			tl := deliverAll(t, q, ids, lease/2) // well before the holder's lease would run out
			require.Less(t, time.Since(killed), lease, "delivered before the dead holder's lease ran out")
			assert.True(t, ownsAll(q, leaseOwners(c, q, lock)), "every bucket taken over")
			p99, worst := late.figures()
			t.Logf("FAULT lease holder %s: %d jobs due over 2 s from 1 s after: lateness p99 %v, max %v (lease %v)", name, n, p99, worst, lease)
			tl.report(t, "lease holder "+name+", the standby takes over")
		})
	}
}

// A standby that dies or freezes is replaced once the holder, at its
// chores, finds it has not looked when it said it would: before the dead
// standby's lease runs out. So when the holder dies next, the new standby
// takes its buckets over within the grace, as after a single failure.
func TestFaultADeadStandbyIsReplacedBeforeItsLeaseRunsOut(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"killed": syscall.SIGKILL, "frozen": syscall.SIGSTOP} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			c := s.Client(t)
			queue := uniqueName(t)
			// The lease is short so that the test is; the holder works at
			// least every second, so that it finds the silent standby well
			// before the standby's lease runs out.
			const lease = 10 * time.Second
			env := []string{"DQ_LEASE=" + lease.String(), "DQ_POLL=1s"}
			var late lateness
			q := newQueue(t, c, WithName(queue), WithLease(lease), WithObserver(&late))
			lock := func(bk bucketKeys) string { return bk.lock }
			standby := func(bk bucketKeys) string { return bk.standby }
			holder := startChild(t, "mover", s.Addr, queue, env...)
			holder.expect(t, "started")
			require.Eventually(t, func() bool { return !slices.Contains(leaseOwners(c, q, lock), "") },
				10*time.Second, time.Millisecond, "the first child holds every bucket")
			first := startChild(t, "mover", s.Addr, queue, env...)
			first.expect(t, "started")
			require.Eventually(t, func() bool { return !slices.Contains(leaseOwners(c, q, standby), "") },
				10*time.Second, time.Millisecond, "the second child stands by for every bucket")
			startQueue(t, q)

			first.signal(t, sig)
			if sig == syscall.SIGSTOP {
				t.Cleanup(func() { _ = first.cmd.Process.Signal(syscall.SIGCONT) })
			}
			// When the dead standby's leases would run out.
			runsOut := time.Now().Add(lease)
			for b := range q.opts.buckets {
				if ttl := c.PTTL(context.Background(), q.keys.bucket(b).standby).Val(); ttl >= 0 && time.Now().Add(ttl).Before(runsOut) {
					runsOut = time.Now().Add(ttl)
				}
			}
			require.Eventually(t, func() bool { return ownsAll(q, leaseOwners(c, q, standby)) },
				2*lease, 10*time.Millisecond, "this process stands by for every bucket")
			require.True(t, time.Now().Before(runsOut), "in place of the dead standby before its lease ran out")

			n := scale(1000, 10_000)
			due := time.Now().Add(time.Second)
			ids := pushN(t, q, n, func(i int) *Job {
				return &Job{Topic: "t", RunAt: due.Add(time.Duration(i%1000) * time.Millisecond)}
			})
			killed := time.Now()
			holder.signal(t, syscall.SIGKILL)
			tl := deliverAll(t, q, ids, lease)
			require.Less(t, time.Since(killed), lease, "delivered before the dead holder's lease ran out")
			assert.True(t, ownsAll(q, leaseOwners(c, q, lock)), "every bucket taken over")
			p99, worst := late.figures()
			t.Logf("FAULT standby %s, then the holder killed: %d jobs due over 1 s from 1 s after: lateness p99 %v, max %v (lease %v)", name, n, p99, worst, lease)
			tl.report(t, "standby "+name+", then the holder killed")
		})
	}
}

// TestFaultHolderAndStandbyDyingTogether: the holder and the standby are
// killed, or frozen, at once, as two processes on one machine that fails.
// The second standby (this test's process) stands in for the standby and
// takes the bucket over: every job is delivered before the standby's
// lease would have run out. The jobs are pushed before the leases are
// taken, so that the standby's last look knew when they fall due, or
// shortly before the kill, due 3 s later, into buckets whose looks were a
// third of the lease away: the standby, woken by the push, looks at once
// and the second standby hears that it should plan for that look; the
// kill comes once it has. (Holder and standby killed within the few
// milliseconds between the push and that look leave the job to the
// second standby's old plan.)
func TestFaultHolderAndStandbyDyingTogether(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		for _, ahead := range []bool{true, false} {
			name := map[syscall.Signal]string{syscall.SIGKILL: "killed", syscall.SIGSTOP: "frozen"}[sig]
			pushed := map[bool]string{true: "pushed ahead", false: "pushed shortly before"}[ahead]
			t.Run(name+", "+pushed, func(t *testing.T) {
				t.Parallel()
				faultTogether(t, sig, ahead, name+" together, jobs "+pushed)
			})
		}
	}
}

func faultTogether(t *testing.T, sig syscall.Signal, ahead bool, name string) {
	s := redistest.Start(t)
	c := s.Client(t)
	queue := uniqueName(t)
	const lease = 20 * time.Second
	env := []string{"DQ_LEASE=" + lease.String()}
	var late lateness
	q := newQueue(t, c, WithName(queue), WithLease(lease), WithObserver(&late))
	n := scale(1000, 10_000)
	push := func(from time.Time) []string {
		return pushN(t, q, n, func(i int) *Job {
			return &Job{Topic: "t", RunAt: from.Add(time.Duration(i%1000) * time.Millisecond)}
		})
	}
	var ids []string
	due := time.Now().Add(time.Second)
	if ahead {
		due = time.Now().Add(8 * time.Second) // after the set-up, before the leases would run out
		ids = push(due)
	}
	lock := func(bk bucketKeys) string { return bk.lock }
	standby := func(bk bucketKeys) string { return bk.standby }
	second := func(bk bucketKeys) string { return bk.second }
	var children []*child
	for _, role := range []func(bucketKeys) string{lock, standby} {
		ch := startChild(t, "mover", s.Addr, queue, env...)
		ch.expect(t, "started")
		require.Eventually(t, func() bool { return !slices.Contains(leaseOwners(c, q, role), "") },
			10*time.Second, time.Millisecond, "the child takes its lease of every bucket")
		children = append(children, ch)
	}
	startQueue(t, q)
	require.Eventually(t, func() bool { return ownsAll(q, leaseOwners(c, q, second)) },
		10*time.Second, time.Millisecond, "this process is the second standby of every bucket")
	if !ahead {
		due = time.Now().Add(3 * time.Second)
		ids = push(due)
		require.Eventually(t, func() bool { return secondLooksBy(c, q, ids, due.Add(time.Second)) },
			10*time.Second, time.Millisecond, "the second standby plans for the standby's look at the pushed jobs")
	}
	require.True(t, time.Now().Before(due), "set up before the jobs fall due: else the holder moves them")
	for _, ch := range children {
		ch.signal(t, sig)
		if sig == syscall.SIGSTOP {
			t.Cleanup(func() { _ = ch.cmd.Process.Signal(syscall.SIGCONT) })
		}
	}
	// When the dead standby's leases would run out.
	killed, runsOut := time.Now(), time.Now().Add(lease)
	for b := range q.opts.buckets {
		if ttl := c.PTTL(context.Background(), q.keys.bucket(b).standby).Val(); ttl >= 0 && killed.Add(ttl).Before(runsOut) {
			runsOut = killed.Add(ttl)
		}
	}
	tl := deliverAll(t, q, ids, 2*lease)
	require.True(t, time.Now().Before(runsOut), "delivered before the dead standby's lease ran out")
	assert.True(t, ownsAll(q, leaseOwners(c, q, lock)), "every bucket taken over")
	p99, worst := late.figures()
	t.Logf("FAULT holder and standby %s: %d jobs due over 1 s: lateness p99 %v, max %v (lease %v)", name, n, p99, worst, lease)
	tl.report(t, "holder and standby "+name)
}

// lateness collects the lateness of every delivery (EventReserved).
type lateness struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *lateness) Observe(_ context.Context, e Event) {
	if e.Kind == EventReserved && e.Lateness >= 0 {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.all = append(l.all, e.Lateness)
	}
}

// figures returns the p99 and the largest lateness seen.
func (l *lateness) figures() (p99, worst time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return 0, 0
	}
	all := slices.Clone(l.all)
	slices.Sort(all)
	return all[len(all)*99/100], all[len(all)-1]
}
