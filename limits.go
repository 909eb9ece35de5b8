package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Topic limits. A topic's jobs sit in every bucket, each its own slot (on a
// Cluster, on several masters), and a script sees one slot: so a limit is
// kept beside the queue's meta, in the queue's slot, and each reservation
// of a limited topic takes three atomic steps. A consumer first takes
// grants there (acquire.lua): no more than the limits leave, counted for
// every process. It then reserves at most that many jobs (reserve.lua, as
// for any topic), and binds each grant to a job's reservation, giving back
// those it did not use (giveback.lua). When the job is settled its grant is
// given back; a grant whose deadline (its job's reservation) passed is
// dropped by the next acquire, so a process that dies gives its capacity
// back when its reservations run out. A rate counts reservations: a grant
// given back leaves the rate log only when no job used it.

// Limits bound how many of a topic's jobs are reserved, by every process
// together. The zero value is no limit.
type Limits struct {
	// Concurrency is how many of the topic's jobs may be reserved at once;
	// 0: no limit. A job counts from its reservation until it is finished,
	// retried, released, or its reservation runs out.
	Concurrency int
	// Rate is how many of the topic's jobs may be reserved per Per (a
	// sliding window); 0: no limit.
	Rate int
	// Per is the window of Rate. Default: one second.
	Per time.Duration
}

// The bounds of Limits.
const (
	maxLimitConcurrency = 1_000_000
	maxLimitRate        = 1_000_000
	maxLimitPer         = 24 * time.Hour
)

// normalize checks l and fills in the default Per.
func (l Limits) normalize() (Limits, error) {
	switch {
	case l.Concurrency < 0 || l.Concurrency > maxLimitConcurrency:
		return l, fmt.Errorf("%w: concurrency %d: want 0 to %d", ErrInvalidLimits, l.Concurrency, maxLimitConcurrency)
	case l.Rate < 0 || l.Rate > maxLimitRate:
		return l, fmt.Errorf("%w: rate %d: want 0 to %d", ErrInvalidLimits, l.Rate, maxLimitRate)
	case l.Per < 0 || l.Per > maxLimitPer:
		return l, fmt.Errorf("%w: per %v: want 1ms to %v", ErrInvalidLimits, l.Per, maxLimitPer)
	case l.Per > 0 && l.Per < time.Millisecond:
		return l, fmt.Errorf("%w: per %v: want 1ms to %v", ErrInvalidLimits, l.Per, maxLimitPer)
	case l.Per > 0 && l.Rate == 0:
		return l, fmt.Errorf("%w: per %v without a rate", ErrInvalidLimits, l.Per)
	case l.Per%time.Millisecond != 0:
		return l, fmt.Errorf("%w: per %v: want whole milliseconds", ErrInvalidLimits, l.Per)
	}
	if l.Rate > 0 && l.Per == 0 {
		l.Per = time.Second
	}
	return l, nil
}

func (l Limits) encode() string {
	return fmt.Sprintf("%d:%d:%d", l.Concurrency, l.Rate, l.Per.Milliseconds())
}

func decodeLimits(s string) (Limits, error) {
	f := strings.Split(s, ":")
	if len(f) != 3 {
		return Limits{}, fmt.Errorf("delayqueue: bad limits %q in Redis", s)
	}
	var n [3]int
	for i := range f {
		v, err := strconv.Atoi(f[i])
		if err != nil {
			return Limits{}, fmt.Errorf("delayqueue: bad limits %q in Redis", s)
		}
		n[i] = v
	}
	return Limits{Concurrency: n[0], Rate: n[1], Per: time.Duration(n[2]) * time.Millisecond}, nil
}

// SetLimits sets topic's limits, for every process: their consumers obey
// them from their next reservation, within a second. The zero Limits
// removes them. Jobs reserved under an earlier concurrency limit of the
// topic count against a new one (not after a removal); those reserved
// while it had none (no limits, or a Rate alone) do not. SetLimits returns ErrInvalidLimits for
// values out of range (negative, a Per under 1ms or over 24h, a Per with
// no Rate) and ErrInvalidTopic for a bad topic; then nothing changes.
func (q *DelayQueue) SetLimits(ctx context.Context, topic string, l Limits) error {
	if err := q.checkTopic(topic); err != nil {
		return err
	}
	l, err := l.normalize()
	if err != nil {
		return err
	}
	lk := q.keys.limit(topic)
	pipe := q.client.TxPipeline() // one slot: MULTI works on a Cluster too
	if l == (Limits{}) {
		pipe.HDel(ctx, q.keys.limits(), topic)
		pipe.Del(ctx, lk.run, lk.rate)
	} else {
		pipe.HSet(ctx, q.keys.limits(), topic, l.encode())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		q.noteError(ctx, err)
		return fmt.Errorf("delayqueue: set limits of %q: %w", topic, redisError(err))
	}
	q.limitsChanged(topic)
	q.announce(ctx, controlLimits+topic)
	return nil
}

// Limits returns topic's limits; the zero Limits when it has none.
func (q *DelayQueue) Limits(ctx context.Context, topic string) (Limits, error) {
	if err := q.checkTopic(topic); err != nil {
		return Limits{}, err
	}
	v, err := q.client.HGet(ctx, q.keys.limits(), topic).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return Limits{}, nil
	case err != nil:
		return Limits{}, fmt.Errorf("delayqueue: limits of %q: %w", topic, redisError(err))
	}
	return decodeLimits(v)
}

// LimitUsage is how much of a topic's limits is in use.
type LimitUsage struct {
	Limits
	Running  int // grants held: jobs reserved, or about to be
	InWindow int // reservations within the last Per
}

// limitUsage reads the limits of every limited topic and their use.
func (q *DelayQueue) limitUsage(ctx context.Context) (map[string]LimitUsage, error) {
	all, err := q.client.HGetAll(ctx, q.keys.limits()).Result()
	if err != nil {
		return nil, fmt.Errorf("delayqueue: limits: %w", redisError(err))
	}
	out := make(map[string]LimitUsage, len(all))
	if len(all) == 0 {
		return out, nil
	}
	// Counted on the server's clock, as the grants are.
	var topics []string
	var calls []*scriptCall
	for topic, v := range all {
		l, err := decodeLimits(v)
		if err != nil {
			return nil, err
		}
		out[topic] = LimitUsage{Limits: l}
		lk := q.keys.limit(topic)
		topics = append(topics, topic)
		calls = append(calls, &scriptCall{script: scriptUsage, keys: []string{lk.run, lk.rate}, args: []any{l.Per.Milliseconds()}})
	}
	q.sendCalls(ctx, calls)
	for i, topic := range topics {
		res, err := calls[i].cmd.Int64Slice()
		if err == nil && len(res) != 2 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		if err != nil {
			return nil, fmt.Errorf("delayqueue: limits of %q: %w", topic, redisError(err))
		}
		u := out[topic]
		u.Running, u.InWindow = int(res[0]), int(res[1])
		out[topic] = u
	}
	return out, nil
}

// limitRefresh is how long a process trusts what it read of which topics
// are limited: a topic limited since then is obeyed after at most this.
const limitRefresh = time.Second

// limiter is what a process knows of the topics' limits, and its consumers
// waiting at a limit.
type limiter struct {
	mu      sync.Mutex
	limited map[string]bool // the topics limited when read
	readAt  time.Time
	waiting map[string]map[*limitWaiter]bool // by topic
	ttr     map[string]time.Duration         // by topic: the longest TTR of its jobs seen
	unrated map[string]bool                  // topics with no Rate, as the last acquire said
	settles map[string]int                   // by topic: jobs with grants whose handlers returned, being settled
	records []string                         // acquire calls answered, whose records can go
}

// limitWaiter is a consumer waiting at its topic's limit.
type limitWaiter struct {
	poke   string        // its own key, pushed to end a blocked wait
	wake   chan struct{} // buffered: the limits changed
	handed chan string   // buffered: a grant handed over by a settled job
}

// isLimited reports whether topic has limits, as read at most limitRefresh
// ago: a topic without limits costs one read per second per process.
func (q *DelayQueue) isLimited(ctx context.Context, topic string) (bool, error) {
	lm := &q.limiter
	lm.mu.Lock()
	if time.Since(lm.readAt) < limitRefresh {
		defer lm.mu.Unlock()
		return lm.limited[topic], nil
	}
	lm.mu.Unlock()
	topics, err := q.client.HKeys(ctx, q.keys.limits()).Result()
	if err != nil {
		q.noteError(ctx, err)
		return false, fmt.Errorf("delayqueue: read limits: %w", redisError(err))
	}
	limited := make(map[string]bool, len(topics))
	for _, t := range topics {
		limited[t] = true
	}
	lm.mu.Lock()
	defer lm.mu.Unlock()
	lm.limited, lm.readAt = limited, time.Now()
	return limited[topic], nil
}

// wasLimited reports whether topic had limits when the process last read
// them, reading nothing.
func (lm *limiter) wasLimited(topic string) bool {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	return lm.limited[topic]
}

// changed forgets what the process read of the limits, wakes the
// consumers of topic ("": of every topic) waiting at a limit, and returns
// the keys of those blocked in Redis.
func (lm *limiter) changed(topic string) []string {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	lm.readAt = time.Time{}
	var pokes []string
	for t, ws := range lm.waiting {
		if topic != "" && t != topic {
			continue
		}
		for lw := range ws {
			select {
			case lw.wake <- struct{}{}:
			default:
			}
			pokes = append(pokes, lw.poke)
		}
	}
	return pokes
}

// enter enlists a consumer waiting at topic's limit, whose own key is poke.
func (lm *limiter) enter(topic, poke string) *limitWaiter {
	lw := &limitWaiter{poke: poke, wake: make(chan struct{}, 1), handed: make(chan string, 1)}
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.waiting == nil {
		lm.waiting = map[string]map[*limitWaiter]bool{}
	}
	if lm.waiting[topic] == nil {
		lm.waiting[topic] = map[*limitWaiter]bool{}
	}
	lm.waiting[topic][lw] = true
	return lw
}

// leave takes lw off the waiters; it returns a grant handed to lw that
// it did not take ("" for none).
func (lm *limiter) leave(topic string, lw *limitWaiter) string {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	delete(lm.waiting[topic], lw)
	if len(lm.waiting[topic]) == 0 {
		delete(lm.waiting, topic)
	}
	select {
	case g := <-lw.handed:
		return g
	default:
		return ""
	}
}

// handOver gives grant, of a job just settled, to a consumer of topic
// waiting at its limit, when the topic has no Rate; it reports whether
// one took it.
func (lm *limiter) handOver(topic, grant string) bool {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if !lm.unrated[topic] {
		return false
	}
	for lw := range lm.waiting[topic] {
		select {
		case lw.handed <- grant:
			delete(lm.waiting[topic], lw) // one grant each
			return true
		default:
		}
	}
	return false
}

// settling counts a job of topic with a grant whose handler returned
// (+1), until it is settled (-1): meanwhile a consumer of the process
// that waits for capacity expects its grant, and waits without a call
// (awaitCapacity).
func (lm *limiter) settling(topic string, n int) {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.settles == nil {
		lm.settles = map[string]int{}
	}
	lm.settles[topic] += n
	if lm.settles[topic] > 0 {
		return
	}
	delete(lm.settles, topic)
	for lw := range lm.waiting[topic] {
		select {
		case lw.wake <- struct{}{}: // none to expect: they take grants anew
		default:
		}
	}
}

// expects reports whether a job of topic being settled may hand its grant
// to a consumer of this process that waits.
func (lm *limiter) expects(topic string) bool {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	return lm.unrated[topic] && lm.settles[topic] > 0
}

// rated records whether topic has a Rate, as an acquire call said.
func (lm *limiter) rated(topic string, rated bool) {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.unrated == nil {
		lm.unrated = map[string]bool{}
	}
	lm.unrated[topic] = !rated
}

// hold is how long a grant of topic lasts before it is bound to a job:
// the longest TTR of its jobs seen (def before any). A process that dies
// between a grant and its reservation holds the slot that long.
func (lm *limiter) hold(topic string, def time.Duration) time.Duration {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if ttr := lm.ttr[topic]; ttr > 0 {
		return ttr
	}
	return def
}

func (lm *limiter) sawTTR(topic string, ttr time.Duration) {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if ttr > lm.ttr[topic] {
		if lm.ttr == nil {
			lm.ttr = map[string]time.Duration{}
		}
		lm.ttr[topic] = ttr
	}
}

// answered notes an acquire call's record that the next give-back deletes.
func (lm *limiter) answered(record string) {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	lm.records = append(lm.records, record)
}

func (lm *limiter) takeAnswered() []string {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	r := lm.records
	lm.records = nil
	return r
}
