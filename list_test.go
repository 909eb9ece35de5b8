package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listAll pages through a listing, calling between before each page after
// the first, and returns the IDs in the order listed.
func listAll(t *testing.T, q *DelayQueue, topic string, state State, limit int, between func(page int, last *Job)) []string {
	t.Helper()
	var ids []string
	var last *Job
	cursor := ""
	for page := 0; ; page++ {
		if page > 0 && between != nil {
			between(page, last)
		}
		p, err := q.List(context.Background(), topic, state, ListOptions{Cursor: cursor, Limit: limit})
		require.NoError(t, err)
		require.LessOrEqual(t, len(p.Jobs), limit)
		for _, job := range p.Jobs {
			require.Equal(t, state, job.State)
			require.Equal(t, topic, job.Topic)
			ids = append(ids, job.ID)
			last = job
		}
		if p.Next == "" {
			return ids
		}
		cursor = p.Next
		require.Less(t, page, 10_000, "the listing does not end")
	}
}

// idsByTime returns the IDs of jobs in the order of the times at gives,
// ties in ID order, as a zset orders them.
func idsByTime(jobs []*Job, at func(*Job) time.Time) []string {
	jobs = slices.Clone(jobs)
	slices.SortFunc(jobs, func(a, b *Job) int {
		if c := at(a).Compare(at(b)); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	ids := make([]string, len(jobs))
	for i, job := range jobs {
		ids[i] = job.ID
	}
	return ids
}

func TestListDelayedInDueOrderAcrossBuckets(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
		var want, jobs []*Job
		for i := range 90 {
			at := base.Add(time.Duration((i*37)%60) * time.Millisecond) // out of order, with ties
			id := fmt.Sprintf("d-%02d", i)
			jobs = append(jobs, &Job{ID: id, Topic: "t", RunAt: at}, &Job{Topic: "other", RunAt: at})
			want = append(want, jobs[len(jobs)-2])
		}
		_, err := q.PushMany(ctx, jobs)
		require.NoError(t, err)
		wantIDs := idsByTime(want, func(j *Job) time.Time { return j.RunAt })
		for _, limit := range []int{1, 7, 90, 1000} {
			assert.Equal(t, wantIDs, listAll(t, q, "t", StateDelayed, limit, nil), "limit %d", limit)
		}
		p, err := q.List(ctx, "t", StateDelayed, ListOptions{Limit: 1})
		require.NoError(t, err)
		require.Len(t, p.Jobs, 1)
		assert.Equal(t, base, p.Jobs[0].RunAt, "a delayed job's RunAt is its due time")
		assert.Zero(t, p.Jobs[0].reservation)
	})
}

func TestListReservedAndDead(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		dead := killJobs(t, q, "t", 5)
		for i := range 6 {
			pushed(t, q, &Job{Topic: "t", TTR: time.Duration(10-i) * time.Minute})
		}
		var reserved []*Job
		for range 6 {
			job, err := q.Pop(ctx, "t", time.Minute)
			require.NoError(t, err)
			reserved = append(reserved, job)
		}
		wantReserved := idsByTime(reserved, func(j *Job) time.Time { return j.ReservedUntil })
		assert.Equal(t, wantReserved, listAll(t, q, "t", StateReserved, 4, nil))
		deadJobs, err := listJobs(ctx, q, "t", StateDead, 10)
		require.NoError(t, err)
		wantDead := idsByTime(deadJobs, func(j *Job) time.Time { return j.DiedAt })
		assert.ElementsMatch(t, dead, wantDead)
		assert.Equal(t, wantDead, listAll(t, q, "t", StateDead, 2, nil))
		p, err := q.List(ctx, "t", StateDead, ListOptions{})
		require.NoError(t, err)
		require.NotEmpty(t, p.Jobs)
		assert.NotZero(t, p.Jobs[0].DiedAt)
		assert.Equal(t, "failed "+string(p.Jobs[0].Body), p.Jobs[0].LastError)
	})
}

func TestListReadyInArrivalOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		q := newQueue(t, be.client)
		var want []string
		for i := range 40 {
			want = append(want, pushed(t, q, &Job{Topic: "t", Body: []byte(fmt.Sprint(i))}))
			pushed(t, q, &Job{Topic: "other"})
		}
		got := listAll(t, q, "t", StateReady, 6, nil)
		assert.ElementsMatch(t, want, got)
		var ats []time.Time
		for _, id := range got {
			job, err := q.Get(context.Background(), id)
			require.NoError(t, err)
			ats = append(ats, job.RunAt)
		}
		assert.True(t, slices.IsSortedFunc(ats, time.Time.Compare), "by the time each became ready")
	})
}

// TestListCursorHoldsWhileJobsMove changes the jobs between pages: jobs
// leave (the one the cursor points at among them), new ones come before
// and after the cursor. Every job that stays from the first page to the
// last is listed once; none is listed twice.
func TestListCursorHoldsWhileJobsMove(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		for _, buckets := range []int{1, 4} {
			t.Run(fmt.Sprint(buckets, " buckets"), func(t *testing.T) {
				q := newQueue(t, be.client, WithBuckets(buckets))
				base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
				stayed := map[string]bool{}
				for i := range 60 {
					id := fmt.Sprintf("k-%02d", i)
					pushed(t, q, &Job{ID: id, Topic: "t", RunAt: base.Add(time.Duration(i/10) * time.Millisecond)}) // ties of 10
					stayed[id] = true
				}
				n := 0
				got := listAll(t, q, "t", StateDelayed, 4, func(page int, last *Job) {
					require.NoError(t, q.Remove(ctx, last.ID)) // the cursor's own job goes
					n++
					pushed(t, q, &Job{ID: fmt.Sprintf("late-%03d", n), Topic: "t", RunAt: base.Add(time.Hour)})
					pushed(t, q, &Job{ID: fmt.Sprintf("early-%03d", n), Topic: "t", RunAt: base.Add(-time.Hour)})
				})
				assertListedOnce(t, got, stayed)
				for i := 1; i <= n; i++ {
					assert.Contains(t, got, fmt.Sprintf("late-%03d", i), "a job that came after the cursor is listed")
				}

				// Ready: consumers take jobs from the head of the lists
				// between pages, fewer and more than the page.
				stayed = map[string]bool{}
				for range 60 {
					stayed[pushed(t, q, &Job{Topic: "r"})] = true
				}
				takes := []int{1, 9, 0, 2, 30}
				got = listAll(t, q, "r", StateReady, 5, func(page int, _ *Job) {
					for range takes[page%len(takes)] {
						job, err := q.Pop(ctx, "r", 0)
						if err == ErrNoJob {
							return
						}
						require.NoError(t, err)
						delete(stayed, job.ID)
					}
					stayed[pushed(t, q, &Job{Topic: "r"})] = false // may or may not be listed
				})
				assertListedOnce(t, got, stayed)
			})
		}
	})
}

// assertListedOnce checks that every ID that stayed (true) is in got once,
// and no ID is there twice.
func assertListedOnce(t *testing.T, got []string, stayed map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	for id, n := range seen {
		assert.Equal(t, 1, n, "%s listed %d times", id, n)
	}
	for id, must := range stayed {
		if must {
			assert.Equal(t, 1, seen[id], "%s stayed but is listed %d times", id, seen[id])
		}
	}
}

// TestListDoesBoundedWork: a topic's few jobs behind many of another
// topic take more than one call to reach, each call stopping short.
func TestListDoesBoundedWork(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, miniredisClient(t), WithBuckets(1))
	noise := make([]*Job, listScan*listRounds+500)
	for i := range noise {
		noise[i] = &Job{Topic: "noise", Delay: time.Hour}
	}
	_, err := q.PushMany(ctx, noise)
	require.NoError(t, err)
	want := []string{
		pushed(t, q, &Job{Topic: "t", Delay: 2 * time.Hour}),
		pushed(t, q, &Job{Topic: "t", Delay: 3 * time.Hour}),
	}
	p, err := q.List(ctx, "t", StateDelayed, ListOptions{Limit: 10})
	require.NoError(t, err)
	assert.Empty(t, p.Jobs, "the first call looked at %d entries and found none", listScan*listRounds)
	require.NotEmpty(t, p.Next)
	p, err = q.List(ctx, "t", StateDelayed, ListOptions{Limit: 10, Cursor: p.Next})
	require.NoError(t, err)
	require.Len(t, p.Jobs, 2)
	assert.Equal(t, want, []string{p.Jobs[0].ID, p.Jobs[1].ID})
	assert.Empty(t, p.Next)
}

func TestListRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, miniredisClient(t))
	for range 3 {
		pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		pushed(t, q, &Job{Topic: "t"})
	}
	delayed, err := q.List(ctx, "t", StateDelayed, ListOptions{Limit: 1})
	require.NoError(t, err)
	ready, err := q.List(ctx, "t", StateReady, ListOptions{Limit: 1})
	require.NoError(t, err)
	require.NotEmpty(t, delayed.Next)
	require.NotEmpty(t, ready.Next)

	_, err = q.List(ctx, "", StateReady, ListOptions{})
	assert.ErrorIs(t, err, ErrInvalidTopic)
	for _, s := range []State{0, 5} {
		_, err = q.List(ctx, "t", s, ListOptions{})
		assert.ErrorIs(t, err, ErrInvalidState)
	}
	for _, l := range []int{-1, maxListLimit + 1} {
		_, err = q.List(ctx, "t", StateReady, ListOptions{Limit: l})
		assert.ErrorIs(t, err, ErrInvalidLimit)
	}
	for name, c := range map[string]struct {
		topic  string
		state  State
		cursor string
	}{
		"garbage":         {"t", StateDelayed, "%%%"},
		"empty bytes":     {"t", StateDelayed, "AA"},
		"another topic":   {"u", StateDelayed, delayed.Next},
		"another state":   {"t", StateReserved, delayed.Next},
		"ready elsewhere": {"t", StateDelayed, ready.Next},
		"cut short":       {"t", StateReady, ready.Next[:len(ready.Next)-1]},
		"cut shorter":     {"t", StateDelayed, delayed.Next[:len(delayed.Next)-3]},
	} {
		_, err = q.List(ctx, c.topic, c.state, ListOptions{Cursor: c.cursor})
		assert.ErrorIs(t, err, ErrInvalidCursor, name)
	}
	other := newQueue(t, q.client, WithBuckets(3))
	_, err = other.List(ctx, "t", StateDelayed, ListOptions{Cursor: delayed.Next})
	assert.ErrorIs(t, err, ErrInvalidCursor, "a cursor of a queue of other buckets")
	twin := newQueue(t, q.client, WithBuckets(q.opts.buckets))
	_, err = twin.List(ctx, "t", StateDelayed, ListOptions{Cursor: delayed.Next})
	assert.ErrorIs(t, err, ErrInvalidCursor, "a cursor of another queue")
}

// TestListReadyHoldsWhenTheCursorsJobComesBack: the job a ready listing
// stopped at is taken, and comes back to the tail of the same list (a
// release, a short retry, a reservation run out); the jobs that stayed in
// between are still listed.
func TestListReadyHoldsWhenTheCursorsJobComesBack(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		var ids []string
		for range 5 {
			ids = append(ids, pushed(t, q, &Job{Topic: "t"}))
		}
		p, err := q.List(ctx, "t", StateReady, ListOptions{Limit: 3})
		require.NoError(t, err)
		require.Len(t, p.Jobs, 3)
		early := p.Next
		var held []*Job
		for range 3 {
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			held = append(held, job)
		}
		require.NoError(t, q.Finish(ctx, held[0].ID))
		require.NoError(t, q.Finish(ctx, held[1].ID))
		require.NoError(t, q.Release(ctx, held[2])) // the cursor's job, back at the tail
		var rest []string
		for cursor := p.Next; cursor != ""; {
			p, err = q.List(ctx, "t", StateReady, ListOptions{Cursor: cursor, Limit: 3})
			require.NoError(t, err)
			for _, job := range p.Jobs {
				rest = append(rest, job.ID)
			}
			cursor = p.Next
		}
		assert.Equal(t, []string{ids[3], ids[4], ids[2]}, rest, "the two that stayed, then the one that came back")

		// The list empties, and its bucket handler lets its places start
		// over: a cursor from before lists what came since.
		for range 3 {
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		_, err = q.moveDue(ctx, 0, "token", true)
		require.NoError(t, err)
		fresh := []string{pushed(t, q, &Job{Topic: "t"}), pushed(t, q, &Job{Topic: "t"})}
		p, err = q.List(ctx, "t", StateReady, ListOptions{Cursor: early})
		require.NoError(t, err)
		got := []string{}
		for _, job := range p.Jobs {
			got = append(got, job.ID)
		}
		assert.Equal(t, fresh, got)
	})
}

// FuzzCursorsAreReadSafely: any string given as a cursor is refused with
// ErrInvalidCursor, or read as a position that reads the same once encoded
// again.
func FuzzCursorsAreReadSafely(f *testing.F) {
	for _, state := range []State{StateDelayed, StateReady, StateDead} {
		c := listCursor{queue: "q", topic: "t", state: state, buckets: 3, lists: []int64{-1, -1, -1}}
		f.Add(c.encode(), uint8(state))
		c.at = &scorePos{1_700_000_000_000, "~ab"}
		c.lists[1] = 41
		f.Add(c.encode(), uint8(state))
	}
	f.Fuzz(func(t *testing.T, s string, state uint8) {
		st := State(state%4 + 1)
		c, err := decodeCursor(s, "q", "t", st, 3)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidCursor)
			return
		}
		again, err := decodeCursor(c.encode(), "q", "t", st, 3)
		require.NoError(t, err)
		require.Equal(t, c, again)
	})
}

// A job rescheduled from ready to delayed leaves its entry in the ready
// list; once it is ready again it has a second one, at the tail. Only that
// one stands for it: the listing shows it once, where it is now, and
// consumers take it there, after the jobs that were ready before it came
// back.
func TestAJobBackInItsReadyListIsListedAndTakenOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		startQueue(t, q)
		ids := []string{"job-1", "job-2", "job-3", "job-4"}
		for _, id := range ids {
			pushed(t, q, &Job{ID: id, Topic: "t"})
		}
		require.NoError(t, q.RescheduleIn(ctx, "job-1", 50*time.Millisecond))
		require.Eventually(t, func() bool {
			job, err := q.Get(ctx, "job-1")
			return err == nil && job.State == StateReady
		}, 10*time.Second, 5*time.Millisecond, "the bucket handler makes job-1 ready again")
		want := []string{"job-2", "job-3", "job-4", "job-1"}
		for _, limit := range []int{1, 2, 10} {
			assert.Equal(t, want, listAll(t, q, "t", StateReady, limit, nil), "limit %d", limit)
		}
		counts, err := q.Counts(ctx, "t")
		require.NoError(t, err)
		assert.Equal(t, 4, counts.Ready)
		for _, id := range want {
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			assert.Equal(t, id, job.ID, "taken in the order they are in the list now")
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		_, err = q.Pop(ctx, "t", 0)
		assert.ErrorIs(t, err, ErrNoJob, "the stale entry was dropped")
	})
}

// The same with a job made ready again at once, and a job pushed in the
// meantime: it comes after that job, listed and taken.
func TestAJobReadyAgainAtOnceComesAfterTheJobsBeforeIt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBuckets(1))
		a := pushed(t, q, &Job{Topic: "t"})
		require.NoError(t, q.RescheduleIn(ctx, a, time.Hour)) // its entry stays in the ready list
		b := pushed(t, q, &Job{Topic: "t"})
		require.NoError(t, q.RescheduleIn(ctx, a, 0)) // and it gets a second one, after b's
		assert.Equal(t, []string{b, a}, listAll(t, q, "t", StateReady, 1, nil))
		first, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Equal(t, b, first.ID, "b became ready before a")
	})
}
