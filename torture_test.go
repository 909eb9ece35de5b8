package delayqueue

// A concurrency torture of the queue: two started DelayQueues on one
// queue, 30 workers calling them at random (Push and PushMany, with and
// without IDs of their own, due now, soon or at a RunAt; Upsert;
// RescheduleIn; Remove; Get; Finish by ID; Pop,
// then Finish, Retry, RetryAfter, Release or Touch, at once or after the
// reservation ran out; a short Consume now and then), and 2 pausers that
// pause and resume topics. Every call is recorded with when it started
// and returned, and what it returned; the checks run on the whole record
// once the calls are over, so that none races with what it judges. A
// call took effect somewhere between its start and its return, and the
// checks conclude only what holds whatever order overlapping calls took
// effect in:
//
//   - What a call stored stays until a call may have ended it (Remove,
//     Finish, a replacing Upsert), and nothing ended comes back: no Pop,
//     Consume or Get that started after such a call returned delivers a
//     body stored before it started. A job is deleted once per creation;
//     ErrNotFound, Existed and the like agree with that.
//   - While a reservation holds (until its deadline, or under Consume
//     until the handler returns), nobody else receives the job, nothing
//     but a deletion or Upsert changes it, and its holder's calls
//     succeed; once it was settled, or a later one taken, they fail.
//   - No delivery before its due time, or past MaxAttempts; none of a
//     topic paused more than a second before the Pop started, until it
//     is resumed.
//   - At rest, Overview, Counts, every page of List in every state and
//     the keys themselves agree exactly; every job is what the calls made
//     it; Pop delivers every ready job once.
//
// A failure prints the calls on the job around it. DQ_SOAK=1 runs for a
// minute per backend instead of 3 seconds.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	tortureWorkers   = 30
	tortureCallerIDs = 40
	// torturePauseBound is how long after Pause returned every process
	// obeys it: Pause's doc says "within a second" (pause.go: a process's
	// view is at most pauseRefresh old, plus a round trip).
	torturePauseBound = time.Second
	// tortureConsumeSlack is how long before its handler started a
	// Consume may have looked at the pause (the reserve call in between).
	tortureConsumeSlack = time.Second
	// tortureKeptTTR is the shortest TTR of a job whose reservation the
	// test expects Consume to extend in time, however loaded the machine
	// (Consume extends it a third of the way through).
	tortureKeptTTR = 400 * time.Millisecond
	// tortureMargin absorbs the rounding of the server's milliseconds when
	// a local time is compared with a reservation's deadline.
	tortureMargin = 25 * time.Millisecond
)

var tortureTopics = []string{"t0", "t1", "t2", "t3"}

func TestTortureConcurrentOperationsKeepTheirPromises(t *testing.T) {
	run := 3 * time.Second
	if soak() {
		run = time.Minute
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		tortureRun(t, be, run)
	})
}

func tortureRun(t *testing.T, be backend, run time.Duration) {
	ctx := context.Background()
	m := newTortureModel()
	name := uniqueName(t)
	opts := []Option{WithName(name), WithBuckets(4), WithDefaultTTR(time.Second), WithMaxAttempts(4),
		WithBackoff(BackoffSchedule(0, 20*time.Millisecond, 60*time.Millisecond)), WithObserver(ObserverFunc(m.observe))}
	qs := []*DelayQueue{newQueue(t, be.client, opts...), newQueue(t, be.client, opts...)}
	for _, q := range qs {
		startQueue(t, q)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %v of calls", seed, run)
	until := time.Now().Add(run)
	var wg sync.WaitGroup
	var calls atomic.Int64
	for i := range tortureWorkers {
		w := &tortureWorker{m: m, qs: qs, name: fmt.Sprintf("w%02d", i), rng: rand.New(rand.NewPCG(seed, uint64(i))), calls: &calls}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(until)
		}()
	}
	for i := range 2 {
		p := &torturePauser{m: m, qs: qs, name: fmt.Sprintf("p%d", i), topics: tortureTopics[2*i : 2*i+2],
			rng: rand.New(rand.NewPCG(seed, uint64(100+i)))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.run(until)
		}()
	}
	wg.Wait()
	t.Logf("%d calls in %v", calls.Load(), time.Since(m.t0).Round(time.Millisecond))

	// Quiescence: nothing is held, no topic paused; every job comes to
	// rest, ready or dead, once what is due has moved and the
	// reservations that ran out have come back.
	quiet := time.Now()
	snap := waitForRest(t, qs[0], m)
	t.Logf("at rest %v after the calls ended: %d jobs", time.Since(quiet).Round(time.Millisecond), len(snap.jobs))

	t.Log(m.figures())
	var report tortureReport
	m.check(&report)
	checkRest(t, ctx, qs[0], m, snap, &report)
	drain(t, ctx, qs[0], snap, &report)
	report.finish(t, m)
}

// tviolation is a broken promise about one job.
type tviolation struct {
	id       string
	msg      string
	from, to time.Time // the calls it concerns, for the history
}

// tortureReport collects what the checks found.
type tortureReport struct {
	violations []tviolation
	state      []string // disagreements of the queue's views at rest
}

func (r *tortureReport) add(id string, from, to time.Time, format string, args ...any) {
	r.violations = append(r.violations, tviolation{id: id, msg: fmt.Sprintf(format, args...), from: from, to: to})
}

func (r *tortureReport) finish(t *testing.T, m *tortureModel) {
	t.Helper()
	for i, o := range m.oddities {
		if i == 20 {
			t.Errorf("... and %d more calls that returned what no doc allows", len(m.oddities)-i)
			break
		}
		t.Errorf("a call returned what its doc does not allow: %s", o)
	}
	shown := 0
	for _, v := range r.violations {
		shown++
		switch {
		case shown <= 12:
			t.Errorf("job %q: %s\n%s", v.id, v.msg, m.history(v.id, v.from, v.to))
		case shown <= 100:
			t.Errorf("job %q: %s", v.id, v.msg)
		}
	}
	if shown > 100 {
		t.Errorf("... %d violations in all", shown)
	}
	for _, s := range r.state {
		t.Error(s)
	}
}
