package delayqueue

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The queue's history: its figures over the last hour, per topic and for
// the whole queue, kept in Redis by the started processes, so that any
// process (one that only pushes, a dashboard, a tool) reads them with
// History.
//
// Every started process runs one sampler goroutine. At each interval
// (WithHistory; 10 s by default), on the Redis server's clock, it makes
// one script call (history.lua, "flush") that adds what the process
// counted in memory since its last call (jobs finished and died per topic,
// reservations and their lateness) to the queue's tallies, and claims the
// interval's sample unless another process has: one process per interval
// wins, however many are started. The winner reads the counts as Overview
// does (one summary.lua call per bucket and 100 topics, pipelined) and
// appends one point per topic and one for the queue (history.lua,
// "write"), trimming each list to its last 360 points in the same call.
//
// Cost: per started process, one script call per interval (0.1/s by
// default); per queue, the sample: one summary call per bucket (and per
// 100 topics) and one write call per interval, or per 30 intervals while
// the queue is quiet (no job reserved, finished or buried since the last
// sample; a push alone shows at the next sample), when an idle started
// process also calls once per 30 intervals. The jobs themselves cost
// nothing more in Redis: a finish, a death and a reservation add to a
// counter in the memory of the process that settles it. Memory: each
// series is at most 360 points of about 40 bytes (at most 14 KB), for the
// queue and at most 500 topics (those with the most jobs), and each
// expires when no sample was written to it for 360 intervals.
//
// Limits: a process that consumes without Start does not count its jobs
// in the throughput, and the last interval of a process that closes is
// not counted.

const (
	// historyPoints is how many samples each series keeps.
	historyPoints = 360
	// historyTopics bounds the topics one sample covers: those with the
	// most jobs.
	historyTopics = 500
	// historyQuiet is how many intervals a quiet queue goes unsampled
	// (5 minutes by default):
	// while no started process reserved, finished or buried a job since
	// the last sample, reading every bucket's counts each interval would
	// be most of an idle queue's cost.
	historyQuiet = 30
)

// A Sample is the figures of a topic, or of the whole queue, at one
// moment of its history (History).
type Sample struct {
	// At is when the sample was taken, on the Redis server's clock.
	At time.Time
	// Counts are the jobs in each state at At.
	Counts
	// Span is the time since the sample before, over which the figures
	// below were counted: the throughput is Finished/Span.
	Span time.Duration
	// Finished, Died and Reservations count the jobs that started
	// processes finished, sent to the dead letters (Retry or a handler's
	// error), and reserved in the Span.
	Finished, Died, Reservations int
	// Lateness and MaxLateness are the mean and the largest time from a
	// job's due time to its reservation, over the Span's reservations.
	Lateness, MaxLateness time.Duration
}

// History returns the samples of topic, or of the whole queue for "",
// oldest first: the last 360, taken every 10 s by default (WithHistory)
// by the processes that called Start. It is one read, whether or not this
// process started; empty, not nil, when no started process has sampled
// in the last 360 intervals. It returns ErrInvalidTopic for a bad topic.
func (q *DelayQueue) History(ctx context.Context, topic string) ([]Sample, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	if topic != "" {
		if err := validateTopic(topic); err != nil {
			return nil, err
		}
	}
	points, err := q.client.LRange(ctx, q.keys.history().series(topic), 0, -1).Result()
	if err != nil {
		q.noteError(ctx, err)
		return nil, fmt.Errorf("delayqueue: read the history of %q: %w", topic, err)
	}
	samples := make([]Sample, 0, len(points))
	for _, p := range points {
		s, err := parsePoint(p)
		if err != nil {
			return nil, fmt.Errorf("delayqueue: read the history of %q: %w", topic, err)
		}
		samples = append(samples, s)
	}
	return samples, nil
}

// A point is a sample as a series holds it: integers, times in ms.
const pointFields = 12

func formatPoint(s Sample) string {
	n := []int64{s.At.UnixMilli(), s.Span.Milliseconds(), int64(s.Delayed), int64(s.Ready), int64(s.Reserved),
		int64(s.Dead), s.OldestReady.Milliseconds(), int64(s.Finished), int64(s.Died), int64(s.Reservations),
		s.Lateness.Milliseconds(), s.MaxLateness.Milliseconds()}
	b := make([]byte, 0, 64)
	for i, v := range n {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return string(b)
}

func parsePoint(p string) (Sample, error) {
	f := strings.Fields(p)
	if len(f) != pointFields {
		return Sample{}, fmt.Errorf("bad point %q", p)
	}
	var n [pointFields]int64
	for i, v := range f {
		var err error
		if n[i], err = strconv.ParseInt(v, 10, 64); err != nil {
			return Sample{}, fmt.Errorf("bad point %q", p)
		}
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	return Sample{
		At: time.UnixMilli(n[0]), Span: ms(n[1]),
		Counts:   Counts{Delayed: int(n[2]), Ready: int(n[3]), Reserved: int(n[4]), Dead: int(n[5]), OldestReady: ms(n[6])},
		Finished: int(n[7]), Died: int(n[8]), Reservations: int(n[9]), Lateness: ms(n[10]), MaxLateness: ms(n[11]),
	}, nil
}

// startHistory turns the tally on and runs the sampler until ctx ends,
// unless WithHistory turned the history off.
func (q *DelayQueue) startHistory(ctx context.Context, wg *sync.WaitGroup) {
	if q.opts.history <= 0 {
		return
	}
	q.tally.busy = make(chan struct{}, 1)
	q.tally.on.Store(true)
	wg.Add(1)
	go func() {
		defer wg.Done()
		q.sampleLoop(ctx)
	}()
}

// sampleLoop flushes the tally and samples once per interval, just after
// each interval begins on the server's clock (with jitter, so that
// processes do not call at one moment).
func (q *DelayQueue) sampleLoop(ctx context.Context) {
	every := q.opts.history
	timer := time.NewTimer(rand.N(every))
	defer timer.Stop()
	failures := 0
	quiet := false // waiting out a quiet queue
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.tally.busy:
			if !quiet {
				continue // the flush of this interval comes anyway
			}
			// This process did something: its counts go at the next
			// interval, not after the quiet wait.
			quiet = false
			timer.Reset(rand.N(every) + every/10)
			continue
		case <-timer.C:
		}
		wait, err := q.sampleHistory(ctx)
		quiet = wait > every+every/10
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			if failures == 1 {
				q.opts.logger.Warn("delayqueue: cannot keep the queue's history; retrying", attrError, err)
			}
			wait = max(retryBackoff(failures), every/10)
		default:
			failures = 0
		}
		timer.Reset(wait)
	}
}

// sampleHistory flushes the tally and, when this process claims the
// interval's sample, writes it. It returns how long to wait for the next
// interval.
func (q *DelayQueue) sampleHistory(ctx context.Context) (time.Duration, error) {
	every := q.opts.history.Milliseconds()
	life := every * historyPoints
	hk := q.keys.history()
	taken := q.tally.take()
	args := []any{"flush", every, life, every * historyQuiet}
	for topic, c := range taken {
		args = append(args, topic, c.finished, c.died, c.reservations, c.late, c.latest)
	}
	reply, err := q.runScript(ctx, scriptHistory, []string{hk.tallies, hk.latest}, args...).Slice()
	if err != nil {
		q.tally.restore(taken)
		q.noteError(ctx, err)
		return 0, fmt.Errorf("delayqueue: flush the history's tallies: %w", redisError(err))
	}
	now, prev, quietUntil, flat, err := readClaim(reply)
	if err != nil {
		return 0, fmt.Errorf("delayqueue: flush the history's tallies: %w", err)
	}
	wait := time.Duration(every-now%every)*time.Millisecond + rand.N(q.opts.history/10+1)
	if len(taken) == 0 && quietUntil > now {
		// A quiet queue, and nothing of this process's to add: its next
		// call is when the quiet queue's sample is due.
		wait = time.Duration(quietUntil-now)*time.Millisecond + rand.N(q.opts.history/10+1)
	}
	if prev < 0 {
		return wait, nil // another process samples this interval, or none does yet
	}
	span := every
	if prev > 0 && prev < now {
		span = now - prev
	}
	return wait, q.writeSample(ctx, now, span, flat, life)
}

// readClaim reads the reply of history.lua's flush.
func readClaim(reply []any) (now, prev, quietUntil int64, flat []any, err error) {
	ok := len(reply) == 4
	if ok {
		now, ok = reply[0].(int64)
	}
	if ok {
		prev, ok = reply[1].(int64)
	}
	if ok {
		flat, ok = reply[2].([]any)
	}
	if ok {
		quietUntil, ok = reply[3].(int64)
	}
	if !ok {
		return 0, 0, 0, nil, fmt.Errorf("unexpected reply %v", reply)
	}
	return now, prev, quietUntil, flat, nil
}

// writeSample reads the counts of every topic and appends the sample at
// now, with the tallies flat of the span before it.
func (q *DelayQueue) writeSample(ctx context.Context, now, span int64, flat []any, life int64) error {
	per := map[string]*Sample{}
	at := func(topic string) *Sample {
		s := per[topic]
		if s == nil {
			s = &Sample{}
			per[topic] = s
		}
		return s
	}
	var jobs int
	err := q.summarize(ctx, "", func(topic string, c Counts) { at(topic).Counts.add(c) }, &jobs)
	if err != nil {
		return fmt.Errorf("delayqueue: sample the history: %w", err)
	}
	late := map[string]int64{}
	err = topicInts(flat, "tally", func(kind, topic string, n int64) {
		s, ms := at(topic), time.Duration(n)*time.Millisecond
		switch kind {
		case "f":
			s.Finished = int(n)
		case "k":
			s.Died = int(n)
		case "n":
			s.Reservations = int(n)
		case "s":
			late[topic] = n
		case "m":
			s.MaxLateness = ms
		}
	})
	if err != nil {
		return fmt.Errorf("delayqueue: sample the history: %w", err)
	}
	var all Sample
	topics := make([]string, 0, len(per))
	for topic, s := range per {
		if s.Reservations > 0 {
			s.Lateness = time.Duration(late[topic]/int64(s.Reservations)) * time.Millisecond
		}
		all.Counts.add(s.Counts)
		all.Finished += s.Finished
		all.Died += s.Died
		all.Reservations += s.Reservations
		all.MaxLateness = max(all.MaxLateness, s.MaxLateness)
		if topic != "" {
			topics = append(topics, topic)
		}
	}
	var lateSum int64
	for _, n := range late {
		lateSum += n
	}
	if all.Reservations > 0 {
		all.Lateness = time.Duration(lateSum/int64(all.Reservations)) * time.Millisecond
	}
	weight := func(s *Sample) int { return s.Delayed + s.Ready + s.Reserved + s.Dead + s.Finished + s.Reservations }
	slices.SortFunc(topics, func(a, b string) int {
		return cmp.Or(cmp.Compare(weight(per[b]), weight(per[a])), strings.Compare(a, b))
	})
	topics = topics[:min(len(topics), historyTopics)]
	hk := q.keys.history()
	keys := []string{hk.all}
	args := []any{"write", historyPoints, life}
	stamp := func(s Sample) string {
		s.At, s.Span = time.UnixMilli(now), time.Duration(span)*time.Millisecond
		return formatPoint(s)
	}
	args = append(args, stamp(all))
	for _, topic := range topics {
		keys = append(keys, hk.series(topic))
		args = append(args, stamp(*per[topic]))
	}
	if err := q.runScript(ctx, scriptHistory, keys, args...).Err(); err != nil {
		q.noteError(ctx, err)
		return fmt.Errorf("delayqueue: write the history: %w", redisError(err))
	}
	return nil
}
