package delayqueue

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The blocked calls: one per group of buckets, each waiting with BLMPOP on
// the signal lists of the topics this process's consumers wait for, and on
// its poke key; and the signals they take, delivered to a waiting consumer
// or held a moment and given back.

// blockFor is how long a blocked call waits before it is sent again: the
// idle cost of a waiting process (one command per blockFor per bucket on a
// Cluster, per process elsewhere). Each expiry is a safety look too, in
// a process that has not started (expired).
const blockFor = 20 * time.Second

// waitGroup is one blocked call's buckets, and what it waits for now.
type waitGroup struct {
	buckets []int
	poke    string            // this process's key in the group's slot
	keys    map[string]sigKey // the lists of the call under way; nil while there is none
	poked   bool              // a poke is on its way to the call under way
	changed chan struct{}     // buffered: topics to wait for came while none was waited for
}

// waitsFor reports whether the group's call under way waits for topic.
func (g *waitGroup) waitsFor(topic string) bool {
	for _, k := range g.keys {
		if k.topic == topic {
			return true
		}
	}
	return false
}

// poke wakes the blocked calls waiting on the poke keys, so that they wait
// for a topic they do not, or end once the waits are closed (a blocked call
// does not end with its context).
func (w *waits) poke(keys []string) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 10*time.Second)
	defer cancel()
	pipe := w.q.client.Pipeline()
	for _, k := range keys {
		pipe.RPush(ctx, k, "1")
		pipe.PExpire(ctx, k, time.Minute) // a process that dies leaves none behind for long
	}
	if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
		w.q.opts.logger.Warn("delayqueue: cannot wake this process's blocked pop; it waits for the topic from its next call", attrError, err)
	}
}

// maxTake is the most signals one blocked call takes, and (unless more
// consumers of a topic wait than a call's share of it) all of a process's
// blocked calls together (wanted).
const maxTake = 64

// wanted returns the keys group g waits on now: the signal lists of the
// topics that consumers wait for (not paused; a topic with signals held has
// no waiter, see enlist), and its poke key; nil when it waits for none. It
// records them as the call under way. n is how many signals the call may
// take, all from the one list its reply comes from: as many as the waiting
// consumers of a topic want jobs, so that a burst of jobs made ready
// together goes to one process with one reply, and to one reserve call per
// consumer (a Consume's fetch is one consumer wanting a job per free
// handler), not a call per job in as many processes.
//
// No call takes more than maxTake. With a call per bucket (a Cluster), each
// takes no more than its share of maxTake (8 with 8 buckets), or one per
// waiting consumer where that is more. A burst lies in
// one bucket (generated IDs fill one bucket at a time, ids.go), and the
// reserve call a signal wakes claims the signals left beside it
// (reserve.lua). Where jobs lie in every bucket (IDs of the caller's), a
// process's calls may together take more than its consumers want: up to
// maxTake in all, against one call's want on one server. The signals no
// consumer came for are held a moment, then given back (deliverLocked),
// and those a dying process held are found by the look for lost signals.
func (w *waits) wanted(g *waitGroup) (keys map[string]sigKey, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() != nil {
		return nil, 0 // closed: no new blocked call, which nothing would poke
	}
	keys = map[string]sigKey{}
	for topic, tw := range w.topics {
		if len(tw.waiters) == 0 || tw.paused {
			continue
		}
		for _, b := range g.buckets {
			keys[w.q.keys.bucket(b).signals(topic)] = sigKey{b, topic}
		}
		want := 0
		for _, wt := range tw.waiters {
			want += wt.want
		}
		want = min(want, max(len(tw.waiters), maxTake/len(w.groups)))
		n = max(n, want) // a reply takes signals from one list: one topic's
	}
	if len(keys) == 0 {
		return nil, 0
	}
	keys[g.poke] = sigKey{bucket: -1}
	g.keys, g.poked = keys, false
	return keys, min(max(n, 1), maxTake)
}

// take waits for signals on names, and returns the list they came from
// and the signals taken: redis.Nil when none came within blockFor.
func (w *waits) take(names []string, n int) (string, []string, error) {
	client, err := w.q.blocker()
	if err != nil {
		return "", nil, err
	}
	if !w.oneAtATime.Load() {
		key, vals, err := client.BLMPop(w.ctx, blockFor, "left", int64(n), names...).Result()
		if err == nil || !isUnknownCommand(err) {
			return key, vals, err
		}
		w.oneAtATime.Store(true)
	}
	res, err := client.BLPop(w.ctx, blockFor, names...).Result()
	if err != nil {
		return "", nil, err
	}
	return res[0], res[1:], nil
}

// isUnknownCommand reports whether err is a server's refusal of a command
// it does not have.
func isUnknownCommand(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// block runs group g's blocked calls until the waits close: each waits for
// the signals of the topics the process's consumers wait for, and hands a
// signal to one of them.
func (w *waits) block(g *waitGroup) {
	failures := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for w.ctx.Err() == nil {
		keys, n := w.wanted(g)
		if keys == nil {
			select {
			case <-g.changed:
				continue
			case <-w.ctx.Done():
				return
			}
		}
		names := make([]string, 0, len(keys))
		for k := range keys {
			names = append(names, k)
		}
		key, signals, err := w.take(names, n)
		w.mu.Lock()
		g.keys = nil
		w.mu.Unlock()
		switch {
		case err == nil:
			failures = 0
			if k, ok := keys[key]; ok && k.bucket >= 0 {
				w.mu.Lock()
				w.deliverLocked(k.bucket, k.topic, len(signals))
				w.mu.Unlock()
			}
		case errors.Is(err, redis.Nil):
			failures = 0
			w.expired(g)
		case w.ctx.Err() != nil, errors.Is(err, ErrClosed):
			return
		default:
			failures++
			w.q.noteError(w.ctx, err)
			if failures == 1 {
				w.q.opts.logger.Warn("delayqueue: cannot wait for ready jobs; retrying", attrError, err)
			}
			timer.Reset(retryBackoff(failures))
			select {
			case <-timer.C:
			case <-w.ctx.Done():
				return
			}
			w.lost(g)
		}
	}
}

// expired is the safety look at the end of group g's blocked call's
// wait. A paused topic is read again, should its resume have been missed:
// a waiting consumer of it looks. Where this process has not started, a
// waiting consumer of every topic looks again at the group's buckets,
// should a signal have been lost: no bucket handler may run anywhere. A
// started process leaves that look to the buckets' holders, in whichever
// processes they run, which look at every topic's list each safety poll
// (everyTopic): a look per bucket, not one per process and bucket. The
// other groups' buckets have calls of their own, whose ends look there: on
// a Cluster, a call per bucket, not one at every bucket each time one of
// them ends.
func (w *waits) expired(g *waitGroup) {
	w.q.mu.Lock()
	started := w.q.started
	w.q.mu.Unlock()
	w.mu.Lock()
	var wake []*waiter
	for _, tw := range w.topics {
		paused := tw.paused
		tw.paused = false // a reserve call says again
		if started && !paused {
			continue
		}
		for _, b := range g.buckets {
			tw.avail[b] = unknown
		}
		if len(tw.waiters) > 0 {
			wake = append(wake, tw.waiters[0])
			tw.waiters = tw.waiters[1:]
		}
	}
	w.mu.Unlock()
	for _, wt := range wake {
		wt.wake <- wakeUp{b: noSignal}
	}
}

// lost handles a blocked call that failed: a signal it took may have been
// lost with its reply. One waiter of each topic per bucket of the group
// looks as if it held a signal there, so that no job is left behind.
func (w *waits) lost(g *waitGroup) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for topic, tw := range w.topics {
		for _, b := range g.buckets {
			if len(tw.waiters) == 0 {
				break
			}
			w.deliverLocked(b, topic, 1)
		}
	}
}

// holdFor is how long a signal taken for a topic whose consumers of this
// process all left meanwhile is kept for the next of them, before it is
// given back for other processes.
const holdFor = 50 * time.Millisecond

// deliverLocked gives n signals of bucket b to the topic's oldest waiters,
// each as many as it wants, and holds the rest for the next.
func (w *waits) deliverLocked(b int, topic string, n int) {
	tw := w.topicLocked(topic)
	if n = w.handLocked(topic, tw, b, n); n > 0 {
		tw.held[b] += n
		time.AfterFunc(holdFor, func() { w.returnHeld(topic) })
	}
}

// handLocked wakes the oldest waiters of topic's tw with n signals of
// bucket b, each with as many as it wants, and returns how many no waiter
// took.
func (w *waits) handLocked(topic string, tw *topicWait, b, n int) int {
	w.wokenTogetherLocked(topic, tw, b, n)
	for n > 0 && len(tw.waiters) > 0 {
		wt := tw.waiters[0]
		tw.waiters = tw.waiters[1:]
		k := min(n, max(wt.want, 1))
		wt.wake <- wakeUp{b: b, n: k}
		n -= k
	}
	return n
}

// wokenWithin bounds how long the reserve calls of consumers woken
// together wait for one another (wokenTogether).
const wokenWithin = time.Millisecond

// wokenTogetherLocked is told, before they wake, that the oldest waiters
// of topic's tw are about to reserve n jobs from bucket b, as many each as
// it wants: the reserve lane of b waits for those it takes, so that their
// calls go together, in one script call, rather than the first alone and
// the rest after its reply. A consumer of a limited topic takes capacity
// first, and may wait for it: those are not waited for.
func (w *waits) wokenTogetherLocked(topic string, tw *topicWait, b, n int) {
	woken := 0
	for _, wt := range tw.waiters {
		if n <= 0 {
			break
		}
		n -= min(n, max(wt.want, 1))
		woken++
	}
	if woken > 1 && !w.q.limiter.wasLimited(topic) {
		w.q.reserves.For(b).Expect(woken, w.woken)
	}
}

// returnHeld gives back the signals of topic that no consumer came for.
func (w *waits) returnHeld(topic string) {
	w.mu.Lock()
	held := w.takeHeldLocked(topic)
	w.mu.Unlock()
	w.giveBackLogged(topic, held)
}

// giveBackLogged gives back held, signals of topic that no consumer came
// for, for at most 10 s whether or not the waits are closed, and logs a
// failure: their jobs then wait for a look for lost signals.
func (w *waits) giveBackLogged(topic string, held map[sigKey]int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 10*time.Second)
	defer cancel()
	if err := w.giveBack(ctx, held); err != nil {
		w.q.opts.logger.Warn("delayqueue: cannot give back ready signals; their jobs wait for a look", attrTopic, topic, attrError, err)
	}
}

// takeHeldLocked takes the held signals of topic ("": of every topic).
func (w *waits) takeHeldLocked(topic string) map[sigKey]int {
	held := map[sigKey]int{}
	for t, tw := range w.topics {
		if topic != "" && t != topic {
			continue
		}
		for b, n := range tw.held {
			if n > 0 {
				held[sigKey{b, t}] = n
				tw.held[b] = 0
			}
		}
	}
	return held
}

// giveBack puts signals back on their lists, for other consumers.
func (w *waits) giveBack(ctx context.Context, held map[sigKey]int) error {
	if len(held) == 0 {
		return nil
	}
	pipe := w.q.client.Pipeline()
	for k, n := range held {
		ones := make([]any, n)
		for i := range ones {
			ones[i] = "1"
		}
		pipe.RPush(ctx, w.q.keys.bucket(k.bucket).signals(k.topic), ones...)
	}
	_, err := pipe.Exec(ctx)
	return redisError(err)
}
