package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seeing inside: how many jobs of each topic are in each state, and how far
// behind consumers are. Each bucket counts its delayed, ready and reserved
// jobs per topic as the scripts move them (scripts/lib/counts.lua), and dead
// letters are counted by their sets, so the figures cost one script call per
// bucket, all in one pipeline, whatever the number of jobs. The listing of
// jobs is in list.go.

// Counts says how many jobs of a topic are in each state.
type Counts struct {
	Delayed, Ready, Reserved, Dead int
	// OldestReady is how long the oldest ready job has waited since it was
	// due (or made ready by a retry, release or requeue), on the Redis
	// server's clock: how far behind the topic's consumers are. Zero when
	// no job is ready, and when the first 1,000 entries of a bucket's ready
	// list are all IDs left by jobs removed or rescheduled (a consumer
	// drops them as it meets them).
	OldestReady time.Duration
}

// add adds c's jobs to s's, and keeps the larger OldestReady.
func (s *Counts) add(c Counts) {
	s.Delayed += c.Delayed
	s.Ready += c.Ready
	s.Reserved += c.Reserved
	s.Dead += c.Dead
	s.OldestReady = max(s.OldestReady, c.OldestReady)
}

// merge takes the figures that c has: a walk of a bucket can meet one
// twice (HSCAN), and each is the bucket's whole figure, not a part of it.
func (s *Counts) merge(c Counts) {
	for _, f := range [][2]*int{{&s.Delayed, &c.Delayed}, {&s.Ready, &c.Ready}, {&s.Reserved, &c.Reserved}, {&s.Dead, &c.Dead}} {
		if *f[1] != 0 {
			*f[0] = *f[1]
		}
	}
	s.OldestReady = max(s.OldestReady, c.OldestReady)
}

// Overview is the queue's figures: per topic, and for the queue as a
// whole, apart. The periodic schedules are listed beside it, by
// Schedules (which the dashboard's overview and dqctl schedules show).
type Overview struct {
	// Topics holds every topic with a job in some state, and every paused
	// topic.
	Topics map[string]Counts
	// Total sums the topics' counts; its OldestReady is the largest.
	Total Counts
	// Jobs is how many jobs the queue's buckets hold, of every topic and
	// state: Total's sum, but for jobs caught between two states by a
	// script that failed half-way (scripts/lib/ready.lua).
	Jobs int
	// Paused lists the paused topics, sorted (Pause).
	Paused []string
	// Limits holds every limited topic's limits and their use (SetLimits).
	Limits map[string]LimitUsage
	// Buckets is the queue's bucket count.
	Buckets int
}

// Overview reads the figures of every topic, a bounded step at a time:
// each script call looks at about 100 of a bucket's counts (and each ready
// topic's oldest job among them), one call per bucket in a pipeline, so
// that it holds Redis briefly however many topics there are. It takes
// about topics/100 round trips, and its figures are those of each step's
// moment.
func (q *DelayQueue) Overview(ctx context.Context) (Overview, error) {
	if q.closed.Load() {
		return Overview{}, ErrClosed
	}
	ov := Overview{Topics: map[string]Counts{}, Buckets: q.opts.buckets}
	err := q.summarize(ctx, "", func(topic string, c Counts) {
		cur := ov.Topics[topic]
		cur.add(c)
		ov.Topics[topic] = cur
	}, &ov.Jobs)
	if err != nil {
		return Overview{}, err
	}
	if ov.Paused, err = q.pausedTopics(ctx); err != nil {
		return Overview{}, err
	}
	slices.Sort(ov.Paused)
	if ov.Limits, err = q.limitUsage(ctx); err != nil {
		return Overview{}, err
	}
	for _, topic := range ov.Paused {
		if _, ok := ov.Topics[topic]; !ok {
			ov.Topics[topic] = Counts{}
		}
	}
	for _, c := range ov.Topics {
		ov.Total.add(c)
	}
	return ov, nil
}

// Counts reads the figures of one topic: one script call per bucket, O(1)
// each (and reading at most 1,000 entries of the topic's ready list), in one
// pipeline. It returns ErrInvalidTopic for a bad topic.
func (q *DelayQueue) Counts(ctx context.Context, topic string) (Counts, error) {
	if err := q.checkTopic(topic); err != nil {
		return Counts{}, err
	}
	var sum Counts
	var jobs int
	err := q.summarize(ctx, topic, func(_ string, c Counts) { sum.add(c) }, &jobs)
	return sum, err
}

// summaryStep is about how many counts or dead topics one summary.lua
// call looks at: each call holds Redis for a bounded time, however many
// topics the queue has.
const summaryStep = 100

// summarize runs summary.lua on every bucket, for topic ("" for all), a
// step at a time (each round one call per bucket still walking, in one
// pipeline), and gives each bucket's counts per topic to each; it adds the
// buckets' job counts to jobs.
func (q *DelayQueue) summarize(ctx context.Context, topic string, each func(topic string, c Counts), jobs *int) error {
	type walk struct {
		counts, dead string            // cursors
		per          map[string]Counts // what the steps found so far
	}
	walks := make(map[int]*walk, q.opts.buckets)
	for b := range q.opts.buckets {
		walks[b] = &walk{"0", "0", map[string]Counts{}}
	}
	first := true
	for len(walks) > 0 {
		var calls []*scriptCall
		for b, w := range walks {
			bk := q.keys.bucket(b)
			calls = append(calls, &scriptCall{script: scriptSummary, bucket: b, args: []any{topic, w.counts, w.dead, summaryStep},
				keys: []string{bk.counts, bk.pool, bk.deadTopics, bk.readyPrefix, bk.deadPrefix}})
		}
		q.sendCalls(ctx, calls)
		for _, c := range calls {
			s, err := readSummary(c.cmd)
			if err != nil {
				return fmt.Errorf("delayqueue: count the jobs of bucket %d: %w", c.bucket, err)
			}
			if first {
				*jobs += s.jobs
			}
			w := walks[c.bucket]
			for t, counts := range s.per {
				cur := w.per[t]
				cur.merge(counts)
				w.per[t] = cur
			}
			w.counts, w.dead = s.counts, s.dead
			if w.counts == "" && w.dead == "" {
				for t, counts := range w.per {
					each(t, counts)
				}
				delete(walks, c.bucket)
			}
		}
		first = false
	}
	return nil
}

// summary is one step of summary.lua on a bucket.
type summary struct {
	per          map[string]Counts
	jobs         int
	counts, dead string // the walks' cursors; "" once done
}

// readSummary reads summary.lua's reply.
func readSummary(cmd *redis.Cmd) (summary, error) {
	reply, err := cmd.Slice()
	if err != nil {
		return summary{}, err
	}
	bad := func() (summary, error) {
		return summary{}, fmt.Errorf("unexpected reply %v", reply)
	}
	if len(reply) != 7 {
		return bad()
	}
	now, ok1 := reply[0].(int64)
	jobs, ok2 := reply[1].(int64)
	counts, ok3 := reply[2].([]any)
	dead, ok4 := reply[3].([]any)
	ages, ok5 := reply[4].([]any)
	countsAt, ok6 := reply[5].(string)
	deadAt, ok7 := reply[6].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 {
		return bad()
	}
	per := map[string]Counts{}
	err = topicInts(counts, "count", func(state, topic string, n int64) {
		if n == 0 || state == "0" {
			return // kept until the bucket handler drops it; entries trimmed (lib/places.lua)
		}
		c := per[topic]
		switch state {
		case strconv.Itoa(int(StateDelayed)):
			c.Delayed = int(n)
		case strconv.Itoa(int(StateReady)):
			c.Ready = int(n)
		case strconv.Itoa(int(StateReserved)):
			c.Reserved = int(n)
		}
		per[topic] = c
	})
	if err == nil {
		err = pairs(dead, func(topic string, v any) error {
			n, err := replyInt(v)
			c := per[topic]
			c.Dead = int(n)
			if c != (Counts{}) {
				per[topic] = c
			}
			return err
		})
	}
	if err == nil {
		err = pairs(ages, func(topic string, v any) error {
			at, err := replyInt(v)
			c := per[topic]
			c.OldestReady = time.Duration(max(now-at, 0)) * time.Millisecond
			per[topic] = c
			return err
		})
	}
	if err != nil {
		return summary{}, err
	}
	return summary{per: per, jobs: int(jobs), counts: countsAt, dead: deadAt}, nil
}

// pairs calls f for each name and value of a flat reply [name, value, ...].
func pairs(flat []any, f func(name string, v any) error) error {
	if len(flat)%2 != 0 {
		return fmt.Errorf("odd reply %v", flat)
	}
	for i := 0; i < len(flat); i += 2 {
		name, ok := flat[i].(string)
		if !ok {
			return fmt.Errorf("unexpected name %v", flat[i])
		}
		if err := f(name, flat[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// topicInts reads a flat reply of integers under "<kind>:<topic>" fields,
// as a counts hash and the history's tallies hold them; what names the
// fields in an error.
func topicInts(flat []any, what string, f func(kind, topic string, n int64)) error {
	return pairs(flat, func(field string, v any) error {
		n, err := replyInt(v)
		kind, topic, ok := strings.Cut(field, ":")
		if err != nil || !ok {
			return fmt.Errorf("%s %q: %v", what, field, v)
		}
		f(kind, topic, n)
		return nil
	})
}

// replyInt reads an integer from a script's reply, sent as an integer or
// as the text of one.
func replyInt(v any) (int64, error) {
	switch n := v.(type) {
	case int64:
		return n, nil
	case string:
		return strconv.ParseInt(n, 10, 64)
	}
	return 0, fmt.Errorf("not an integer: %v", v)
}
