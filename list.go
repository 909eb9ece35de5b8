package delayqueue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Listing a topic's jobs by state, a page at a time, without blocking
// Redis: each call looks at a bounded number of entries per bucket
// (listScan, at most listRounds times), one script call per bucket
// (list.lua), all in one pipeline per round.
//
// Delayed and reserved jobs wait in the bucket zsets, among the jobs of
// every topic, scored by due time or reservation deadline; dead jobs in
// their topic's dead-letter zsets, scored by when they died. One position
// in the order (score, ID) serves every bucket: a round takes from each
// bucket the jobs after it, and returns only those before the point where
// the first bucket stopped looking, so that none is passed over.
// Ready jobs wait in their topic's ready lists, in arrival order, with no
// score: the cursor keeps a place in each bucket's list (an index that
// entries leaving the head do not shift, scripts/lib/places.lua), and a round
// merges the buckets' jobs by due time.

const (
	// listScan is how many entries one round looks at in each bucket.
	listScan = 1000
	// listRounds bounds the rounds of one List call.
	listRounds = 4
	// defaultListLimit is the page size when ListOptions.Limit is 0.
	defaultListLimit = 100
	// maxListLimit is the largest page.
	maxListLimit = 1000
)

// ListOptions says which page of a listing List returns.
type ListOptions struct {
	// Cursor continues a listing: the Next of the page before; "" starts
	// at the beginning.
	Cursor string
	// Limit is the most jobs the page holds: 1 to 1,000; 0 means 100.
	Limit int
}

// A JobPage is one page of a listing.
type JobPage struct {
	// Jobs are the page's jobs, in order.
	Jobs []*Job
	// Next continues the listing after this page (ListOptions.Cursor); ""
	// when the listing reached its end.
	Next string
}

// List lists the jobs of topic in state, a page at a time, in order:
// delayed jobs by due time, ready jobs by arrival, reserved jobs by
// reservation deadline, dead jobs by when they died. Pass each page's Next
// to get the next page, until it is "". A page may hold fewer jobs than
// Limit, even none, before the end. List returns ErrInvalidTopic,
// ErrInvalidState, ErrInvalidLimit, or ErrInvalidCursor for a cursor it did
// not give for the same queue, topic and state.
func (q *DelayQueue) List(ctx context.Context, topic string, state State, opts ListOptions) (JobPage, error) {
	if err := q.checkTopic(topic); err != nil {
		return JobPage{}, err
	}
	if state < StateDelayed || state > StateDead {
		return JobPage{}, fmt.Errorf("%w: %d", ErrInvalidState, state)
	}
	limit := opts.Limit
	if limit == 0 {
		limit = defaultListLimit
	}
	if limit < 1 || limit > maxListLimit {
		return JobPage{}, fmt.Errorf("%w: %d; a page holds 1 to %d jobs", ErrInvalidLimit, opts.Limit, maxListLimit)
	}
	cur, err := decodeCursor(opts.Cursor, q.opts.name, topic, state, q.opts.buckets)
	if err != nil {
		return JobPage{}, err
	}
	if state == StateReady {
		return q.listReady(ctx, topic, cur, limit)
	}
	return q.listScored(ctx, topic, state, cur, limit)
}

// listed is a job one round found, at its position in what it walked.
type listed struct {
	pos int64
	job *Job
}

// listStep is one bucket's answer to a round (list.lua).
type listStep struct {
	done  bool
	last  listed // where it got to; a nil job when it looked at nothing
	found []listed
}

// listScored lists delayed, reserved or dead jobs (see the top of the file).
func (q *DelayQueue) listScored(ctx context.Context, topic string, state State, cur listCursor, limit int) (JobPage, error) {
	var page JobPage
	for range listRounds {
		need := limit - len(page.Jobs)
		steps, err := q.listRound(ctx, topic, state, need, func(b int) (string, string) {
			if cur.at == nil {
				return "", ""
			}
			return strconv.FormatInt(cur.at.score, 10), cur.at.member
		})
		if err != nil {
			return JobPage{}, err
		}
		var found []scored
		var bound *scorePos // where the first bucket to stop short stopped
		allDone := true
		for _, s := range steps {
			for _, l := range s.found {
				found = append(found, scored{scorePos{l.pos, l.job.ID}, l.job})
			}
			if !s.done {
				allDone = false
				if p := (scorePos{s.last.pos, s.last.job.ID}); bound == nil || p.compare(*bound) < 0 {
					bound = &p
				}
			}
		}
		slices.SortFunc(found, func(a, b scored) int { return a.at.compare(b.at) })
		if bound != nil {
			found = slices.DeleteFunc(found, func(s scored) bool { return s.at.compare(*bound) > 0 })
		}
		take := found[:min(need, len(found))]
		for _, s := range take {
			page.Jobs = append(page.Jobs, s.job)
		}
		if len(take) < len(found) {
			cur.at = &take[len(take)-1].at
			break
		}
		// Every job up to bound is on the page.
		if allDone {
			return page, nil
		}
		cur.at = bound
		if len(page.Jobs) == limit {
			break
		}
	}
	page.Next = cur.encode()
	return page, nil
}

// scored is a job found in a zset, at its position.
type scored struct {
	at  scorePos
	job *Job
}

// listReady lists ready jobs (see the top of the file).
func (q *DelayQueue) listReady(ctx context.Context, topic string, cur listCursor, limit int) (JobPage, error) {
	var page JobPage
	seen := map[string]bool{} // an ID can be in a list twice (lib/places.lua)
	for range listRounds {
		need := limit - len(page.Jobs)
		steps, err := q.listRound(ctx, topic, StateReady, need, func(b int) (string, string) {
			if p := cur.lists[b]; p >= 0 {
				return strconv.FormatInt(p, 10), ""
			}
			return "", ""
		})
		if err != nil {
			return JobPage{}, err
		}
		// Merge the buckets' jobs by due time, each bucket's in its list's
		// order, so that each bucket's position is its last job taken.
		heads := make([]int, len(steps))
		for taken := 0; taken < need; taken++ {
			best := -1
			for b, s := range steps {
				if heads[b] < len(s.found) && (best < 0 ||
					s.found[heads[b]].job.RunAt.Before(steps[best].found[heads[best]].job.RunAt)) {
					best = b
				}
			}
			if best < 0 {
				break
			}
			if l := steps[best].found[heads[best]]; !seen[l.job.ID] {
				seen[l.job.ID] = true
				page.Jobs = append(page.Jobs, l.job)
			}
			heads[best]++
		}
		allDone, allTaken := true, true
		for b, s := range steps {
			switch {
			case heads[b] == len(s.found) && s.last.job != nil:
				cur.lists[b] = s.last.pos
			case heads[b] < len(s.found):
				allTaken = false
				if heads[b] > 0 {
					cur.lists[b] = s.found[heads[b]-1].pos
				}
			}
			allDone = allDone && s.done
		}
		if allDone && allTaken {
			return page, nil
		}
		if len(page.Jobs) == limit {
			break
		}
	}
	page.Next = cur.encode()
	return page, nil
}

// listRound runs one round of list.lua on every bucket, each resuming
// after the position after gives it.
func (q *DelayQueue) listRound(ctx context.Context, topic string, state State, need int, after func(b int) (string, string)) ([]listStep, error) {
	calls := make([]*scriptCall, q.opts.buckets)
	for b := range calls {
		bk := q.keys.bucket(b)
		key, kind := bk.zset, "z"
		switch state {
		case StateReady:
			key, kind = bk.ready(topic), "l"
		case StateDead:
			key = bk.dead(topic)
		}
		pos, member := after(b)
		calls[b] = &scriptCall{script: scriptList, bucket: b, keys: []string{key, bk.pool, bk.counts},
			args: []any{kind, topic, int(state), need, listScan, pos, member}}
	}
	q.sendCalls(ctx, calls)
	steps := make([]listStep, len(calls))
	for b, c := range calls {
		s, err := readListStep(c)
		if err != nil {
			return nil, fmt.Errorf("delayqueue: list %s jobs of %q in bucket %d: %w", state, topic, b, err)
		}
		for _, l := range s.found {
			q.read(l.job)
		}
		steps[b] = s
	}
	return steps, nil
}

// readListStep reads list.lua's reply.
func readListStep(c *scriptCall) (listStep, error) {
	reply, err := c.cmd.Slice()
	if err != nil {
		return listStep{}, err
	}
	if len(reply) < 3 || (len(reply)-3)%3 != 0 {
		return listStep{}, fmt.Errorf("unexpected reply %v", reply)
	}
	var s listStep
	done, err := replyInt(reply[0])
	if err != nil {
		return listStep{}, err
	}
	s.done = done == 1
	if last, _ := reply[2].(string); last != "" {
		pos, err := replyInt(reply[1])
		if err != nil {
			return listStep{}, err
		}
		s.last = listed{pos, &Job{ID: last}}
	}
	for i := 3; i < len(reply); i += 3 {
		id, _ := reply[i].(string)
		v, _ := reply[i+2].(string)
		pos, err := replyInt(reply[i+1])
		if err != nil {
			return listStep{}, err
		}
		job, err := decodeJob(id, []byte(v))
		if err != nil {
			return listStep{}, err
		}
		job.reservation = 0 // not the caller's reservation
		if job.State == StateDelayed {
			job.RunAt = time.UnixMilli(pos) // its score (lib/codec.lua)
		}
		s.found = append(s.found, listed{pos, job})
	}
	return s, nil
}
