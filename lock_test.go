package delayqueue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMoveDueRespectsAnotherHoldersLease(t *testing.T) {
	ctx := context.Background()
	q, m, c, _, id := dueUnderAnother(t)
	bk := q.keys.bucket(0)

	res, err := q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, roleStandby, res.role, "a free standby lease is taken")
	assert.Equal(t, 30*time.Second, res.wait, "how long the holder's lease has to run")
	assert.Equal(t, takeoverGrace, res.next, "until the job, due now, is overdue by the grace")
	job, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, StateDelayed, job.State, "a handler without the lease moves nothing")
	standby, err := c.Get(ctx, bk.standby).Result()
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("mine %d %d", q.opts.lease.Milliseconds(), time.UnixMilli(1_700_000_001_000).Add(takeoverGrace).UnixMilli()), standby,
		"the token, its lease, and when it looks again: once the job is overdue by the grace")

	m.FastForward(time.Second)
	res, err = q.moveDue(ctx, 0, "third", false)
	require.NoError(t, err)
	assert.Equal(t, roleSecond, res.role, "a free second standby lease is taken")
	assert.Equal(t, takeoverGrace+101*time.Millisecond, res.next, "until the standby would be a tenth of a second late")
	res, err = q.moveDue(ctx, 0, "fourth", false)
	require.NoError(t, err)
	assert.Equal(t, roleNone, res.role, "the three leases are held")
	assert.Equal(t, c.PTTL(ctx, bk.second).Val(), res.wait, "until the second standby's would run out")
	ok, err := q.unlock(ctx, 0, "third")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Zero(t, c.Exists(ctx, bk.second).Val(), "the second standby gives up its lease")
	assert.Equal(t, int64(1), c.Exists(ctx, bk.standby).Val(), "and only its own")

	ok, err = q.unlock(ctx, 0, "mine")
	require.NoError(t, err)
	assert.False(t, ok, "a handler cannot release a lease it does not hold")
	assert.Zero(t, c.Exists(ctx, bk.standby).Val(), "but gives up its standby lease")

	require.NoError(t, c.Del(ctx, bk.lock).Err())
	res, err = q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, roleHolder, res.role)
	assert.Equal(t, 1, res.moved, "a free lease is taken")
	holder, err := c.Get(ctx, bk.lock).Result()
	require.NoError(t, err)
	assert.Equal(t, "mine "+strconv.FormatInt(q.opts.lease.Milliseconds(), 10), holder)
	ok, err = q.unlock(ctx, 0, "mine")
	require.NoError(t, err)
	assert.True(t, ok)
}

// The standby takes a bucket over once a job is overdue by the grace and
// the holder has moved nothing for as long; not before.
func TestTheStandbyTakesOverFromASilentHolder(t *testing.T) {
	ctx := context.Background()
	// The holder renewed its 30 s lease a moment ago.
	q, m, c, advance, id := dueUnderAnother(t)
	bk := q.keys.bucket(0)
	advance(takeoverGrace + time.Millisecond)
	res, err := q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, roleStandby, res.role, "overdue, but the holder moved within the grace: left alone")

	// The holder last renewed its lease a whole grace ago.
	m.FastForward(takeoverGrace + time.Millisecond)
	res, err = q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, roleHolder, res.role, "taken over")
	assert.True(t, res.fresh)
	assert.True(t, res.vacated, "the others are told")
	assert.Equal(t, 1, res.moved)
	assert.Zero(t, c.Exists(ctx, bk.standby).Val(), "the standby lease is free for another")
	job, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, StateReady, job.State)
}

// The standby comes back when it could take the bucket over: when the
// next job is overdue by the grace and the holder silent as long, not a
// whole grace after it found the job due.
func TestTheStandbyLooksAgainWhenItCouldTakeOver(t *testing.T) {
	ctx := context.Background()
	q, m, c, advance, _ := dueUnderAnother(t)
	bk := q.keys.bucket(0)
	advance(100 * time.Millisecond)
	m.FastForward(100 * time.Millisecond)
	res, err := q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	require.Equal(t, roleStandby, res.role)
	assert.Equal(t, takeoverGrace-100*time.Millisecond, res.next)

	require.NoError(t, c.Set(ctx, bk.lock, "other 30000", 30*time.Second).Err())
	res, err = q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, takeoverGrace, res.next, "the holder just moved: silent for a grace more")
}

// A standby that takes a lease its holder let go (at Close) frees the
// standby lease for another, as one that takes the bucket over does:
// otherwise nobody stands by until the standby lease runs out.
func TestAStandbyThatTakesALeaseLetGoFreesTheStandbyLease(t *testing.T) {
	ctx := context.Background()
	for _, second := range []bool{false, true} {
		t.Run(fmt.Sprintf("second standby %v", second), func(t *testing.T) {
			q, _, c, _ := clockQueue(t)
			bk := q.keys.bucket(0)
			require.NoError(t, c.Set(ctx, bk.lock, "other 30000", 30*time.Second).Err())
			role := roleStandby
			if second {
				require.NoError(t, c.Set(ctx, bk.standby, "standby 30000 1700000010000", 30*time.Second).Err())
				role = roleSecond
			}
			res, err := q.moveDue(ctx, 0, "mine", false)
			require.NoError(t, err)
			require.Equal(t, role, res.role)
			require.NoError(t, c.Del(ctx, bk.lock).Err()) // the holder let go
			res, err = q.moveDue(ctx, 0, "mine", false)
			require.NoError(t, err)
			assertStandbyFreed(t, q, c, res, second)
		})
	}
}

// dueUnderAnother is clockQueue with a job, id, due now in its one
// bucket, whose 30 s lease another process renewed a moment ago.
func dueUnderAnother(t *testing.T) (*DelayQueue, *miniredis.Miniredis, *redis.Client, func(time.Duration), string) {
	t.Helper()
	q, m, c, advance := clockQueue(t)
	id := pushed(t, q, &Job{Topic: "t", Delay: time.Second})
	advance(time.Second)
	require.NoError(t, c.Set(context.Background(), q.keys.bucket(0).lock, "other 30000", 30*time.Second).Err())
	return q, m, c, advance, id
}

// heldQueue is clockQueue with a minute's lease, whose one bucket the
// token "mine" holds.
func heldQueue(t *testing.T) (*DelayQueue, *miniredis.Miniredis, *redis.Client, func(time.Duration)) {
	t.Helper()
	q, m, c, advance := clockQueue(t, WithLease(time.Minute))
	res, err := q.moveDue(context.Background(), 0, "mine", false)
	require.NoError(t, err)
	require.Equal(t, roleHolder, res.role)
	return q, m, c, advance
}

// assertStandbyFreed checks that the holder's move that gave res freed
// the standby lease of bucket 0 (the second standby's with second) and
// said so, and that another process then takes it.
func assertStandbyFreed(t *testing.T, q *DelayQueue, c *redis.Client, res moveResult, second bool) {
	t.Helper()
	ctx := context.Background()
	key, role := q.keys.bucket(0).standby, roleStandby
	if second {
		key, role = q.keys.bucket(0).second, roleSecond
	}
	assert.Equal(t, roleHolder, res.role)
	assert.True(t, res.vacated, "the others are told")
	assert.Zero(t, c.Exists(ctx, key).Val(), "the lease is free for another")
	res, err := q.moveDue(ctx, 0, "third", false)
	require.NoError(t, err)
	assert.Equal(t, role, res.role, "another takes it")
}

// A standby says in its lease when it will look again, and looks at least
// every third of its lease. The holder, at its chores, frees the lease of
// one that has not looked a second after it said it would (died, or
// froze), and says so: another process stands by at once, not when the
// dead standby's lease runs out. A standby lease that gives its lease but
// no next look is freed after half its lease of silence. So goes a second
// standby's lease; the other, looking, is kept.
func TestTheHolderFreesTheLeaseOfASilentStandby(t *testing.T) {
	ctx := context.Background()
	start := time.UnixMilli(1_700_000_000_000) // clockQueue's clock
	healthy := "looking 60000 " + strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
	for _, tc := range []struct {
		name, standby string
		lease         time.Duration // the standby's
		late          time.Duration // how long from now it may be silent
		onTTL         bool          // told from the lease's time to live, not the clock
	}{
		{"it said when it would look", "other 20000 " + strconv.FormatInt(start.Add(5*time.Second).UnixMilli(), 10), 20 * time.Second, 6 * time.Second, false},
		{"no next look, but its lease", "other 20000", 20 * time.Second, 10 * time.Second, true},
	} {
		for _, second := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, second standby %v", tc.name, second), func(t *testing.T) {
				q, m, c, advance := heldQueue(t)
				pass := advance
				if tc.onTTL {
					pass = m.FastForward
				}
				bk := q.keys.bucket(0)
				key, kept := bk.standby, bk.second
				if second {
					key, kept = bk.second, bk.standby
				}
				require.NoError(t, c.Set(ctx, kept, healthy, time.Hour).Err())
				require.NoError(t, c.Set(ctx, key, tc.standby, tc.lease).Err())

				pass(tc.late)
				res, err := q.moveDue(ctx, 0, "mine", true)
				require.NoError(t, err)
				assert.False(t, res.vacated, "not yet late: kept")
				pass(time.Millisecond)
				res, err = q.moveDue(ctx, 0, "mine", false)
				require.NoError(t, err)
				assert.False(t, res.vacated, "looked at with the chores only")
				require.Equal(t, tc.standby, c.Get(ctx, key).Val())

				res, err = q.moveDue(ctx, 0, "mine", true)
				require.NoError(t, err)
				assertStandbyFreed(t, q, c, res, second) // late
				res, err = q.moveDue(ctx, 0, "mine", true)
				require.NoError(t, err)
				assert.False(t, res.vacated, "one that just looked is kept")
				assert.Equal(t, healthy, c.Get(ctx, kept).Val(), "the other, looking, is kept")
			})
		}
	}
}

// A standby lease of an older version holds its token alone: its lease is
// not known, so the holder cannot tell how long it has been silent, and
// leaves it to run out rather than free a healthy standby again and again;
// so does a second standby.
func TestTheHolderLeavesAStandbyLeaseWithoutItsLease(t *testing.T) {
	ctx := context.Background()
	q, m, c, _ := heldQueue(t)
	bk := q.keys.bucket(0)
	require.NoError(t, c.Set(ctx, bk.standby, "other", 20*time.Second).Err())
	m.FastForward(20*time.Second - time.Millisecond)
	res, err := q.moveDue(ctx, 0, "mine", true)
	require.NoError(t, err)
	assert.False(t, res.vacated)
	res, err = q.moveDue(ctx, 0, "third", false)
	require.NoError(t, err)
	assert.Equal(t, roleSecond, res.role, "nor does the second standby stand in for it")
	assert.Equal(t, "other", c.Get(ctx, bk.standby).Val(), "left to run out")
}

// The second standby looks when the standby would be a tenth of a second late,
// and stands by in the place of one that is, when the bucket needs it (a
// job overdue by the grace, and the holder silent as long: both died
// together), taking the bucket over in the same call; while the holder
// moves, it waits until the standby is a second late, as the holder
// would. Either way it says so, for another to become the second standby.
func TestTheSecondStandbyStandsInForALateStandby(t *testing.T) {
	ctx := context.Background()
	for _, holderAlive := range []bool{true, false} {
		t.Run(fmt.Sprintf("holder alive %v", holderAlive), func(t *testing.T) {
			q, m, c, advance, id := dueUnderAnother(t)
			bk := q.keys.bucket(0)
			passes := func(d time.Duration) {
				advance(d)
				m.FastForward(d)
				if holderAlive {
					require.NoError(t, c.Set(ctx, bk.lock, "other 30000", 30*time.Second).Err())
				}
			}
			res := standbyAndSecond(t, q)
			assert.Equal(t, fmt.Sprintf("mine 30000 %d", time.UnixMilli(1_700_000_001_000).Add(res.next).UnixMilli()), c.Get(ctx, bk.second).Val(),
				"the token, its lease, and when it looks again")

			passes(takeoverGrace + 100*time.Millisecond)
			res, err := q.moveDue(ctx, 0, "mine", false)
			require.NoError(t, err)
			assert.Equal(t, roleSecond, res.role, "not yet late")
			assert.Equal(t, time.Millisecond, res.next)

			passes(time.Millisecond)
			if holderAlive {
				// The holder moves: the second standby looks again when
				// the bucket could be in need, until the standby is a
				// second late (900 ms from here).
				for range 3 {
					res, err = q.moveDue(ctx, 0, "mine", false)
					require.NoError(t, err)
					assert.Equal(t, roleSecond, res.role, "the holder moves: not pushed out yet")
					assert.Equal(t, takeoverGrace, res.next, "until the holder would be silent for the grace")
					passes(res.next)
				}
			}
			res, err = q.moveDue(ctx, 0, "mine", false)
			require.NoError(t, err)
			assert.True(t, res.vacated, "the others are told")
			assert.Zero(t, c.Exists(ctx, bk.second).Val(), "the second standby lease is free for another")
			job, err := q.Get(ctx, id)
			require.NoError(t, err)
			if holderAlive {
				assert.Equal(t, roleStandby, res.role, "in the late standby's place")
				assert.True(t, strings.HasPrefix(c.Get(ctx, bk.standby).Val(), "mine "))
				assert.Equal(t, StateDelayed, job.State)
				res, err = q.moveDue(ctx, 0, "fourth", false)
				require.NoError(t, err)
				assert.Equal(t, roleSecond, res.role, "another is the second standby")
				return
			}
			assert.Equal(t, roleHolder, res.role, "the holder is silent too: taken over")
			assert.True(t, res.fresh)
			assert.Equal(t, 1, res.moved)
			assert.Zero(t, c.Exists(ctx, bk.standby).Val(), "the standby lease is free for another")
			assert.Equal(t, StateReady, job.State)
		})
	}
}

// standbyAndSecond has "standby" stand by for bucket 0 of a queue from
// dueUnderAnother, and "mine" become its second standby, which looks again
// when the standby would be a tenth of a second late.
func standbyAndSecond(t *testing.T, q *DelayQueue) moveResult {
	t.Helper()
	res, err := q.moveDue(context.Background(), 0, "standby", false)
	require.NoError(t, err)
	require.Equal(t, roleStandby, res.role)
	res, err = q.moveDue(context.Background(), 0, "mine", false)
	require.NoError(t, err)
	require.Equal(t, roleSecond, res.role)
	require.Equal(t, takeoverGrace+101*time.Millisecond, res.next)
	return res
}

// A holder that dies just before the second standby finds the standby
// late leaves the bucket not yet in need (silent for less than the
// grace): the second standby looks again when it would be, and takes the
// bucket over then, not when the standby is a second late.
func TestTheSecondStandbyLooksAgainWhenTheBucketWouldBeInNeed(t *testing.T) {
	ctx := context.Background()
	q, m, c, advance, id := dueUnderAnother(t)
	bk := q.keys.bucket(0)
	passes := func(d time.Duration) {
		advance(d)
		m.FastForward(d)
	}
	res := standbyAndSecond(t, q)

	const lastMove = 200 * time.Millisecond // before the second standby's look
	passes(res.next - lastMove)
	require.NoError(t, c.Set(ctx, bk.lock, "other 30000", 30*time.Second).Err(), "the holder's last move; it dies")
	passes(lastMove)
	res, err := q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, roleSecond, res.role, "the holder was heard from within the grace")
	assert.Equal(t, takeoverGrace-lastMove, res.next, "until it has been silent for the grace")

	passes(res.next)
	res, err = q.moveDue(ctx, 0, "mine", false)
	require.NoError(t, err)
	assert.Equal(t, roleHolder, res.role, "taken over")
	assert.Equal(t, 1, res.moved)
	job, err := q.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, StateReady, job.State)
}

// A bucket handler that takes the standby's place announces the second
// standby lease it leaves, and a second standby's handler wakes for a
// vacancy: the three roles refill without waiting out a lease.
func TestTheSecondStandbysHandlerAnnouncesAndWakes(t *testing.T) {
	ctx := context.Background()
	q, m, c, advance := clockQueue(t)
	holder, standby, second := threeProcesses(t, q, c)
	for _, h := range []*bucketHandler{holder, standby, second} {
		h.step(ctx)
	}
	require.Equal(t, []leaseRole{roleHolder, roleStandby, roleSecond}, []leaseRole{holder.lease.role, standby.lease.role, second.lease.role})

	woke := make(chan bool)
	go func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		woke <- second.sleep(ctx, timer, time.Hour)
	}()
	second.standbyVacant()
	assert.True(t, <-woke, "a vacancy wakes the second standby")

	sub := c.Subscribe(ctx, q.keys.control())
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(ctx) // the confirmation
	require.NoError(t, err)
	// The standby dies, and misses its look by over a second.
	passes := func(d time.Duration) { advance(d); m.FastForward(d) }
	passes(q.opts.lease/3 + time.Second + time.Millisecond)
	second.step(ctx)
	require.Equal(t, roleStandby, second.lease.role, "in the dead standby's place")
	wait, cancel := context.WithTimeout(ctx, time.Minute) // a guard: without the announcement, fail rather than hang
	defer cancel()
	msg, err := sub.ReceiveMessage(wait)
	require.NoError(t, err)
	assert.Equal(t, controlStandby+"0", msg.Payload, "the second standby lease it left is announced")
}

// threeProcesses are bucket handlers of q's one bucket, each of a queue of
// its own, as three processes have; the first to step holds the lease, the
// next stands by, the third is the second standby.
func threeProcesses(t *testing.T, q *DelayQueue, c *redis.Client) (a, b, d *bucketHandler) {
	t.Helper()
	process := func() *bucketHandler {
		return newBucketHandler(newQueue(t, c, WithName(q.opts.name), WithBuckets(1)), 0)
	}
	return process(), process(), process()
}

// arrives waits, without a tight bound, for what ch brings.
func arrives[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("nothing arrived within a minute")
		var none T
		return none
	}
}

// A standby woken for a job due over a second before the look its lease
// announces (a job pushed into a quiet bucket) looks at once, and tells
// the second standby, which planned for the announced look: it looks then
// and plans for the new one. Else, should holder and standby die before
// the old plan, the job would wait for it.
func TestTheSecondStandbyHearsOfTheStandbysSoonerLook(t *testing.T) {
	ctx := context.Background()
	q, _, c, _ := clockQueue(t)
	holder, standby, second := threeProcesses(t, q, c)
	holder.step(ctx)
	standby.step(ctx)
	require.Equal(t, renewWithin(q.opts.lease), second.step(ctx), "a quiet bucket: the second standby looks in a third of the lease")
	require.Equal(t, []leaseRole{roleHolder, roleStandby, roleSecond}, []leaseRole{holder.lease.role, standby.lease.role, second.lease.role})

	sub := c.Subscribe(ctx, q.keys.control())
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(ctx) // the confirmation
	require.NoError(t, err)
	planned := renewWithin(q.opts.lease)
	const delay = 5 * time.Second // the job's; over a second before the announced look
	looks := make(chan time.Time)
	go func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		if standby.sleep(ctx, timer, planned) {
			looks <- time.Now()
		}
	}()
	pushed(t, q, &Job{Topic: "t", Delay: delay})
	woken := time.Now()
	standby.wake(delay) // the push's wake-up, as the bucket's channel brings it
	assert.True(t, arrives(t, looks).Before(woken.Add(delay)), "the standby looks at once, not when the job falls due")
	require.Equal(t, delay+takeoverGrace, standby.step(ctx), "and plans to look once the job is overdue by the grace")
	wait, cancel := context.WithTimeout(ctx, time.Minute) // a guard: without the announcement, fail rather than hang
	defer cancel()
	msg, err := sub.ReceiveMessage(wait)
	require.NoError(t, err)
	assert.Equal(t, controlSooner+"0", msg.Payload, "the second standby is told")

	woke := make(chan time.Time)
	go func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		if second.sleep(ctx, timer, time.Hour) {
			woke <- time.Now()
		}
	}()
	h := handlerOf(msg.Payload, controlSooner, []*bucketHandler{second})
	require.Same(t, second, h, "the message names the bucket's handler")
	h.lookSooner()
	arrives(t, woke) // it wakes
	assert.Equal(t, delay+takeoverGrace+101*time.Millisecond, second.step(ctx), "a tenth of a second after the standby's new look")
	res, err := q.moveDue(ctx, 0, standby.lease.token, false)
	require.NoError(t, err)
	assert.False(t, res.sooner, "planned for: nothing to tell")
}

func TestClosedHandlerHandsItsBucketsOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		// Leases last an hour: the second queue gets the buckets within the
		// test only because the first one releases them.
		first, err := New(be.client, WithName(name), WithLogger(discard), WithLease(time.Hour), WithBuckets(2))
		require.NoError(t, err)
		startQueue(t, first)
		second := newQueue(t, be.client, WithName(name), WithLease(time.Hour), WithBuckets(2))
		holders := func() []string {
			var hs []string
			for b := range 2 {
				h, _ := be.client.Get(ctx, first.keys.bucket(b).lock).Result()
				hs = append(hs, h)
			}
			return hs
		}
		require.Eventually(t, func() bool {
			hs := holders()
			return strings.HasPrefix(hs[0], first.handlers[0].lease.token+" ") && strings.HasPrefix(hs[1], first.handlers[1].lease.token+" ")
		}, 10*time.Second, 5*time.Millisecond)
		startQueue(t, second)
		closeQueue(t, first)

		require.Eventually(t, func() bool {
			hs := holders()
			return strings.HasPrefix(hs[0], second.handlers[0].lease.token+" ") && strings.HasPrefix(hs[1], second.handlers[1].lease.token+" ")
		}, 30*time.Second, 5*time.Millisecond, "the second queue takes the released buckets")
		for range 4 {
			pushed(t, second, &Job{Topic: "t", Delay: 50 * time.Millisecond})
		}
		seen := consume(t, []*DelayQueue{second}, "t", 2, 4)
		assert.Len(t, seen, 4)
	})
}
