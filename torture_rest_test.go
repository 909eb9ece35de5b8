package delayqueue

// The torture at rest: the queue's views and keys agree, and every job
// is what the calls made it.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tsnapshot is what the queue's keys hold, read key by key.
type tsnapshot struct {
	jobs   map[string]*Job
	bucket map[string]int
	zsets  []int64
	ready  []map[string][]string // per bucket: topic -> ready list
	dead   []map[string][]string // per bucket: topic -> dead letters
}

// scanPool reads every bucket's pool, zset, ready lists and dead letters.
func scanPool(q *DelayQueue) (*tsnapshot, error) {
	ctx := context.Background()
	s := &tsnapshot{jobs: map[string]*Job{}, bucket: map[string]int{}}
	for b := range q.opts.buckets {
		bk := q.keys.bucket(b)
		pool, err := q.client.HGetAll(ctx, bk.pool).Result()
		if err != nil {
			return nil, err
		}
		for id, v := range pool {
			job, err := decodeJob(id, []byte(v))
			if err != nil {
				return nil, err
			}
			s.jobs[id], s.bucket[id] = job, b
		}
		n, err := q.client.ZCard(ctx, bk.zset).Result()
		if err != nil {
			return nil, err
		}
		s.zsets = append(s.zsets, n)
		ready, dead := map[string][]string{}, map[string][]string{}
		for _, topic := range tortureTopics {
			if ready[topic], err = q.client.LRange(ctx, bk.ready(topic), 0, -1).Result(); err != nil {
				return nil, err
			}
			if dead[topic], err = q.client.ZRange(ctx, bk.dead(topic), 0, -1).Result(); err != nil {
				return nil, err
			}
		}
		s.ready, s.dead = append(s.ready, ready), append(s.dead, dead)
	}
	return s, nil
}

// atRest reports whether every job is ready or dead, and no bucket holds
// a due time or a reservation.
func (s *tsnapshot) atRest() bool {
	for _, job := range s.jobs {
		if job.State != StateReady && job.State != StateDead {
			return false
		}
	}
	for _, n := range s.zsets {
		if n != 0 {
			return false
		}
	}
	return true
}

// restless describes what keeps the queue from resting.
func (s *tsnapshot) restless(m *tortureModel) string {
	var out []string
	for id, job := range s.jobs {
		if job.State != StateReady && job.State != StateDead {
			out = append(out, fmt.Sprintf("%q is %v (due %s, reserved until %s)\n%s",
				id, job.State, m.ms(job.RunAt), m.ms(job.ReservedUntil), m.history(id, time.Time{}, time.Time{})))
		}
	}
	slices.Sort(out)
	return fmt.Sprintf("bucket zsets hold %v entries; %d jobs not ready or dead:\n%s", s.zsets, len(out), strings.Join(out[:min(len(out), 5)], "\n"))
}

// waitForRest waits until every job is ready or dead.
func waitForRest(t *testing.T, q *DelayQueue, m *tortureModel) *tsnapshot {
	t.Helper()
	var mu sync.Mutex // the condition runs on a goroutine of its own
	var snap *tsnapshot
	var lastErr error
	if !assert.Eventually(t, func() bool {
		s, err := scanPool(q)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			lastErr = err
			return false
		}
		snap = s
		return s.atRest()
	}, time.Minute, 20*time.Millisecond) {
		mu.Lock()
		defer mu.Unlock()
		if snap == nil {
			t.Fatalf("cannot read the queue's keys: %v", lastErr)
		}
		t.Fatalf("the queue does not come to rest: %s", snap.restless(m))
	}
	return snap
}

// tally counts the snapshot's jobs per topic and state.
func (s *tsnapshot) tally() map[string]Counts {
	per := map[string]Counts{}
	for _, job := range s.jobs {
		c := per[job.Topic]
		switch job.State {
		case StateDelayed:
			c.Delayed++
		case StateReady:
			c.Ready++
		case StateReserved:
			c.Reserved++
		case StateDead:
			c.Dead++
		}
		per[job.Topic] = c
	}
	return per
}

// checkRest: at rest, Overview, Counts, List and the keys agree exactly,
// every ready job is in its ready list and every dead one in its dead
// letters, and every job is what the calls made it.
func checkRest(t *testing.T, ctx context.Context, q *DelayQueue, m *tortureModel, snap *tsnapshot, r *tortureReport) {
	t.Helper()
	want := snap.tally()
	ov, err := q.Overview(ctx)
	require.NoError(t, err)
	if ov.Jobs != len(snap.jobs) {
		r.state = append(r.state, fmt.Sprintf("Overview counts %d jobs; the pools hold %d", ov.Jobs, len(snap.jobs)))
	}
	if len(ov.Paused) != 0 {
		r.state = append(r.state, fmt.Sprintf("Overview says %v paused after every topic was resumed", ov.Paused))
	}
	for _, topic := range tortureTopics {
		got := ov.Topics[topic]
		got.OldestReady = 0
		if got != want[topic] {
			r.state = append(r.state, fmt.Sprintf("Overview counts topic %s as %+v; the pools hold %+v", topic, got, want[topic]))
		}
		counts, err := q.Counts(ctx, topic)
		require.NoError(t, err)
		counts.OldestReady = 0
		if counts != want[topic] {
			r.state = append(r.state, fmt.Sprintf("Counts(%s) is %+v; the pools hold %+v", topic, counts, want[topic]))
		}
	}
	for topic := range ov.Topics {
		if !slices.Contains(tortureTopics, topic) {
			r.state = append(r.state, fmt.Sprintf("Overview has a topic %q that no job has", topic))
		}
	}
	for _, topic := range tortureTopics {
		for state := StateDelayed; state <= StateDead; state++ {
			checkListing(t, ctx, q, snap, r, topic, state)
		}
	}
	for id, job := range snap.jobs {
		b := snap.bucket[id]
		switch job.State {
		case StateReady:
			if !slices.Contains(snap.ready[b][job.Topic], id) {
				r.add(id, time.Time{}, time.Time{}, "ready, but not in its ready list: it is never delivered")
			}
		case StateDead:
			if !slices.Contains(snap.dead[b][job.Topic], id) {
				r.add(id, time.Time{}, time.Time{}, "dead, but not in its dead letters")
			}
		}
	}
	for b, dead := range snap.dead {
		for topic, ids := range dead {
			for _, id := range ids {
				if job := snap.jobs[id]; job == nil || job.State != StateDead || job.Topic != topic || snap.bucket[id] != b {
					r.add(id, time.Time{}, time.Time{}, "in the dead letters of topic %s in bucket %d, but the pool holds %v", topic, b, job)
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := map[string]bool{}
	for id := range m.events {
		ids[id] = true
	}
	for id := range snap.jobs {
		ids[id] = true
	}
	end := time.Now()
	for id := range ids {
		newJobCheck(m, r, id).checkAtRest(snap.jobs[id], end)
	}
}

// checkListing: List, page by page, lists each job of the topic in the
// state once, and no other.
func checkListing(t *testing.T, ctx context.Context, q *DelayQueue, snap *tsnapshot, r *tortureReport, topic string, state State) {
	t.Helper()
	want := map[string]bool{}
	for id, job := range snap.jobs {
		if job.Topic == topic && job.State == state {
			want[id] = true
		}
	}
	seen := map[string]int{}
	cursor := ""
	for page := 0; ; page++ {
		require.Less(t, page, 100_000, "the listing of %s %v jobs does not end", topic, state)
		p, err := q.List(ctx, topic, state, ListOptions{Cursor: cursor, Limit: 1 + rand.IntN(25)})
		require.NoError(t, err)
		for _, job := range p.Jobs {
			seen[job.ID]++
			if job.State != state || job.Topic != topic {
				r.add(job.ID, time.Time{}, time.Time{}, "List(%s, %v) lists it as a %v job of %s", topic, state, job.State, job.Topic)
			}
		}
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	for id, n := range seen {
		switch {
		case !want[id]:
			r.add(id, time.Time{}, time.Time{}, "List(%s, %v) lists it; the pool holds %v", topic, state, snap.jobs[id])
		case n > 1:
			r.add(id, time.Time{}, time.Time{}, "List(%s, %v) lists it %d times", topic, state, n)
		}
	}
	for id := range want {
		if seen[id] == 0 {
			r.add(id, time.Time{}, time.Time{}, "List(%s, %v) does not list it", topic, state)
		}
	}
}

func countOf(ids []string, id string) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

// checkAtRest: the job at rest (nil: none) is what the calls made it: a
// body stored under its ID and not ended since, or, when there is none,
// a call may have deleted the last one.
func (c *jobCheck) checkAtRest(job *Job, end time.Time) {
	m := c.m
	if job == nil {
		if v := c.mustExist(end, end, nil); v != nil {
			c.add(v.create.start, end, "lost: body %s (%s, returned at %s) is gone, and no call could have deleted it",
				v.body, v.create.what, m.ms(v.create.end))
		}
		return
	}
	if len(c.evs) == 0 {
		c.add(time.Time{}, time.Time{}, "the pool holds a job (%v) that no call pushed", job)
		return
	}
	v := m.versions[string(job.Body)]
	switch {
	case v == nil || v.id != c.id:
		c.add(time.Time{}, time.Time{}, "the pool holds body %s, never pushed under this ID", job.Body)
		return
	case !v.create.stores() && !v.create.unexpected:
		c.add(v.create.start, end, "the pool holds body %s, which %s did not store", v.body, v.create.what)
		return
	case job.Topic != v.topic:
		c.add(v.create.start, end, "the pool holds body %s as a job of topic %s; it was pushed to %s", v.body, job.Topic, v.topic)
	}
	if k := c.killedBetween(v.create.end, end); k != nil {
		c.add(v.create.start, end, "the pool holds body %s, which %s ended at %s..%s", v.body, k.what, m.ms(k.start), m.ms(k.end))
	}
	// Dead with attempts left only by ErrSkipRetry; ready only with one left.
	switch {
	case job.State == StateDead && job.Attempts < v.max && !slices.ContainsFunc(c.evs, func(x *tevent) bool {
		return x.kind == kRetry && x.err == nil && strings.Contains(x.what, "ErrSkipRetry") && x.del.ev.body == v.body
	}):
		c.add(v.create.start, end, "dead after %d of its %d attempts, and no Retry(ErrSkipRetry) killed it", job.Attempts, v.max)
	case job.State == StateReady && job.Attempts >= v.max:
		c.add(v.create.start, end, "ready after all %d of its attempts", v.max)
	}
	// A body stored after it, that no other call may have changed, is the
	// one that stays.
	for _, w := range c.acked {
		if w == v || !w.create.start.After(v.create.start) {
			continue
		}
		if !c.any(w.create.start, end.Add(time.Hour), func(x *tevent) bool {
			return x != w.create && (x.mayDelete() || x.mayCreate() || x.stores() || x.unexpected)
		}) {
			c.add(w.create.start, end, "the pool holds body %s, but body %s (%s) was stored after it and no call could have changed it",
				v.body, w.body, w.create.what)
		}
	}
}

// drain pops every ready job at rest, once each, and finishes it; then
// nothing is left but the dead.
func drain(t *testing.T, ctx context.Context, q *DelayQueue, snap *tsnapshot, r *tortureReport) {
	t.Helper()
	for _, topic := range tortureTopics {
		want := map[string]string{}
		for id, job := range snap.jobs {
			if job.Topic == topic && job.State == StateReady {
				want[id] = string(job.Body)
			}
		}
		got := map[string]int{}
		for n := 0; ; n++ {
			require.Less(t, n, len(want)+100, "popping %s does not end", topic)
			job, err := q.Pop(ctx, topic, 0)
			if errors.Is(err, ErrNoJob) {
				break
			}
			require.NoError(t, err)
			got[job.ID]++
			switch body, ok := want[job.ID]; {
			case !ok:
				r.add(job.ID, time.Time{}, time.Time{}, "popped at rest from %s; the pool held %v", topic, snap.jobs[job.ID])
			case body != string(job.Body):
				r.add(job.ID, time.Time{}, time.Time{}, "popped at rest with body %s; the pool held %s", job.Body, body)
			case got[job.ID] > 1:
				r.add(job.ID, time.Time{}, time.Time{}, "popped at rest %d times", got[job.ID])
			}
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		for id := range want {
			if got[id] == 0 {
				r.add(id, time.Time{}, time.Time{}, "ready at rest, but Pop does not deliver it")
			}
		}
	}
	ov, err := q.Overview(ctx)
	require.NoError(t, err)
	tally := snap.tally()
	for _, topic := range tortureTopics {
		got, want := ov.Topics[topic], Counts{Dead: tally[topic].Dead}
		got.OldestReady = 0
		if got != want {
			r.state = append(r.state, fmt.Sprintf("after every ready job was popped and finished, Overview counts %s as %+v; want %+v", topic, got, want))
		}
	}
}
