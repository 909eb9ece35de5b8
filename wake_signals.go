package delayqueue

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Waiting for ready jobs. Every job made ready adds a ready signal to its
// topic's signal list in its bucket (scripts/lib/signals.lua). A process
// whose consumers wait blocks on those lists with BLMPOP (BLPOP where the
// server has none), taking up to as many signals as its waiting consumers
// want jobs (wanted), and Redis hands each signal to one blocked client: a
// job wakes one consumer, in whichever process, however many wait. One
// blocked call waits for every topic the process's consumers wait for: one
// per bucket on a Cluster (a call's keys share a slot), one in all
// elsewhere, so a process holds a handful of connections however many
// topics it consumes. A reserve call
// takes no more jobs than the signals its caller holds or claims
// (reserve.lua), so the consumer a signal woke finds its job.

// unknown is what a process knows of the signals a bucket's list holds
// before a reserve call has said.
const unknown = -1

// noSignal wakes a waiter to look where signals are left, holding none.
const noSignal = -1

// strandedAfter is how long after a reserve call took a list's last signal
// a waiting consumer of this process looks at the list once more. A signal
// taken by a process that died before it reserved the job is lost; the job
// then waits in its list with no signal, and a reserve call takes it once
// it has waited a second (reserve.lua). Without this look, no call would
// come for it until a blocked call's wait ended (blockFor).
const strandedAfter = 1100 * time.Millisecond

// othersLook is how long a process whose look for a lost signal found that
// another process had looked (reserve.lua's lost-signal key) leaves the
// looks there to others: under load every process's replies say jobs are
// left without a signal, and the looks of all but one would read the
// list's length each strandedAfter for nothing.
const othersLook = 4 * strandedAfter

// waits is a process's consumers waiting for ready jobs, and its blocked
// calls.
type waits struct {
	q      *DelayQueue
	token  string        // names this process's poke keys
	woken  time.Duration // wokenWithin; longer in tests
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	groups []*waitGroup

	mu     sync.Mutex
	topics map[string]*topicWait
	// oneAtATime: the server has no BLMPOP (miniredis, Redis before 7):
	// a blocked call takes one signal.
	oneAtATime atomic.Bool
}

// topicWait is what the consumers of one topic in this process wait for.
type topicWait struct {
	waiters []*waiter   // oldest first
	avail   []int       // per bucket: signals left, as the last reserve call said; unknown at first
	held    []int       // per bucket: signals taken while no consumer waited
	recheck []bool      // per bucket: a look after strandedAfter is due
	lost    []bool      // per bucket: the next look there is one for a lost signal (reserveLost)
	quiet   []time.Time // per bucket: until when other processes look there for lost signals
	looked  []time.Time // per bucket: when a look of this process's for a lost signal last looked
	// per bucket: since when every reply said jobs were left without a
	// signal (zero: the last said the list ran dry)
	bare    []time.Time
	said    []uint64 // per bucket: how many replies were settled (one per consumer a call served)
	giving  int      // signals that reserve calls under way take for the waiters (toGive)
	paused  bool     // a reserve call found the topic paused; until a resume
	resumes uint64   // resumes heard (resume), so that a reply sent before one does not pause the topic again
}

// waiter is one waiting consumer, wanting up to want jobs. The signals
// taken for it arrive on wake, in one wake-up: up to want signals of one
// bucket, whose jobs it may reserve.
type waiter struct {
	wake chan wakeUp // buffered
	want int
}

// wakeUp wakes a waiter: with n signals of bucket b, or (b is noSignal)
// to look where signals are left, holding none.
type wakeUp struct {
	b, n int
}

// sigKey is what a signal list stands for.
type sigKey struct {
	bucket int
	topic  string
}

func newWaits(q *DelayQueue) *waits {
	w := &waits{q: q, token: newToken()[:16], woken: wokenWithin, topics: map[string]*topicWait{}}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	n := 1
	if q.pub == "SPUBLISH" {
		n = q.opts.buckets
	}
	for g := range n {
		wg := &waitGroup{changed: make(chan struct{}, 1)}
		if n == 1 {
			wg.buckets = make([]int, q.opts.buckets)
			for b := range wg.buckets {
				wg.buckets[b] = b
			}
		} else {
			wg.buckets = []int{g}
		}
		wg.poke = q.keys.bucket(wg.buckets[0]).poke(w.token)
		w.groups = append(w.groups, wg)
	}
	for _, g := range w.groups {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.block(g)
		}()
	}
	return w
}

// close ends the blocked calls and gives back the signals held.
func (w *waits) close(ctx context.Context) error {
	// Cancelled under the lock: a group between calls sends no new one
	// (wanted), and a call under way is poked.
	w.mu.Lock()
	w.cancel()
	var poke []string
	for _, g := range w.groups {
		if g.keys != nil {
			poke = append(poke, g.poke)
		}
	}
	w.mu.Unlock()
	w.poke(poke)
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.mu.Lock()
	held := w.takeHeldLocked("")
	w.mu.Unlock()
	return w.giveBack(ctx, held)
}

// topic returns the topic's wait, made on first use. w.mu must be held.
func (w *waits) topicLocked(topic string) *topicWait {
	tw := w.topics[topic]
	if tw == nil {
		n := w.q.opts.buckets
		tw = &topicWait{avail: make([]int, n), held: make([]int, n), recheck: make([]bool, n), lost: make([]bool, n), quiet: make([]time.Time, n), looked: make([]time.Time, n), bare: make([]time.Time, n), said: make([]uint64, n)}
		for b := range tw.avail {
			tw.avail[b] = unknown
		}
		w.topics[topic] = tw
	}
	return tw
}

// look is one reserve call a consumer makes: n jobs at most from bucket b,
// with held signals of its own; claim when it comes, holding none, only
// for signals a reply said were left (reserveClaim); lost when it comes
// for a lost signal (reserveLost). said is the bucket's count of replies
// when the look was planned.
type look struct {
	b, n, held  int
	claim, lost bool
	said        uint64
}

// plan lists the reserve calls a consumer of topic that wants n jobs makes
// now: with the signals this process holds, then where signals are left or
// not known (all: everywhere, for a consumer that will not wait), from
// bucket start on. It takes the held signals it plans to use.
func (w *waits) plan(topic string, n, start int, all bool) []look {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topicLocked(topic)
	if tw.paused {
		return nil
	}
	var looks []look
	buckets := len(tw.avail)
	for i := range buckets {
		b := (start + i) % buckets
		if tw.held[b] > 0 && n > 0 {
			h := min(tw.held[b], n)
			tw.held[b] -= h
			looks = append(looks, look{b: b, n: h, held: h})
			n -= h
		}
	}
	// Where signals are left, no more than those, most first, so that
	// consumers planning together go to one bucket and share its reserve
	// call; then where not known, as many as wanted (the call says).
	order := make([]int, buckets)
	for i := range order {
		order[i] = (start + i) % buckets
	}
	if !all {
		slices.SortStableFunc(order, func(x, y int) int { return tw.avail[y] - tw.avail[x] })
	}
	for _, b := range order {
		a := tw.avail[b]
		if all {
			a = unknown
		}
		if a == 0 || n == 0 {
			continue
		}
		k := n
		if a > 0 {
			// Counted off until a call says again, so that consumers
			// planning meanwhile do not all go for the same signals.
			k = min(n, a)
			n -= k
			tw.avail[b] -= k
		}
		if j := slices.IndexFunc(looks, func(l look) bool { return l.b == b }); j >= 0 {
			looks[j].n += k
		} else {
			// A first look at a bucket (no reply yet) looks for a lost
			// signal too: when every worker was stopped at once, the
			// new processes' first looks find the jobs whose signals
			// died with the old ones, and one a second is enough.
			lost := a < 0 && (tw.lost[b] || tw.said[b] == 0)
			looks = append(looks, look{b: b, n: k, claim: a > 0, lost: lost, said: tw.said[b]})
			tw.lost[b] = false
		}
	}
	return looks
}

// outdated reports whether look l of a consumer of topic, which holds no
// signal, has lost its reason since it was planned: a reply that came
// since left the bucket with no signal that no other consumer of this
// process is going for, and no reply since the list last ran dry said
// jobs are left without a signal. A consumer sends its
// looks one after another, and consumers that start together plan a look
// at every bucket whose signals are not known yet: the first replies tell
// the rest where nothing waits.
func (w *waits) outdated(topic string, l look) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topicLocked(topic)
	return l.held == 0 && tw.said[l.b] != l.said && tw.avail[l.b] == 0 && tw.bare[l.b].IsZero()
}

// toGive is how many of the signals a reserve call of topic leaves it
// takes for this process's waiting consumers (reserveCall): as many jobs
// as they want, less the signals this process holds for them and those
// that calls under way are taking for them. It counts them as taken until
// gave. A topic with limits gets none: its consumers take capacity first,
// and may wait for it.
func (w *waits) toGive(topic string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topics[topic]
	if tw == nil || tw.paused || w.ctx.Err() != nil || w.q.limiter.wasLimited(topic) {
		return 0
	}
	n := -tw.giving
	for _, wt := range tw.waiters {
		n += max(wt.want, 1)
	}
	for _, h := range tw.held {
		n -= h
	}
	n = min(max(n, 0), maxReserve)
	tw.giving += n
	return n
}

// gave hands to this process's waiting consumers the given signals of
// bucket b that a reserve call of topic took for them, of the asked that
// toGive counted (none when the call failed). Once the waits are closed,
// they go back to their list at once.
func (w *waits) gave(topic string, b, asked, given int) {
	w.mu.Lock()
	tw := w.topicLocked(topic)
	tw.giving -= asked
	if w.ctx.Err() == nil || given == 0 {
		w.deliverLocked(b, topic, given)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.giveBackLogged(topic, map[sigKey]int{{b, topic}: given})
}

// jobsWait reports whether jobs of topic are known to wait for consumers:
// a reserve call left signals, or this process holds some.
func (w *waits) jobsWait(topic string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topics[topic]
	if tw == nil {
		return false
	}
	for b := range tw.avail {
		if tw.avail[b] > 0 || tw.held[b] > 0 {
			return true
		}
	}
	return false
}

// resumed is how many resumes of topic this process has heard. A reserve
// call reads it before it is sent, and passes it to settle.
func (w *waits) resumed(topic string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.topicLocked(topic).resumes
}

// settle records what a reserve call on bucket b said: the signals left
// (or reserveNoSignal: none, and jobs are left without one; reserveDry:
// none, and no job is left), and whether the topic is paused. resumes is
// resumed's count before the call was sent: a reply that says paused while
// a resume was heard since ran before the resume, and does not pause the
// topic again; settle then reports that the caller should look again.
func (w *waits) settle(topic string, b, left int, status reserveStatus, resumes uint64) (again bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topicLocked(topic)
	if status == reservePaused && tw.resumes != resumes {
		tw.avail[b] = unknown
		return true
	}
	tw.said[b]++
	tw.lost[b] = false
	unsignalled := left == reserveNoSignal
	switch {
	case unsignalled && tw.bare[b].IsZero():
		tw.bare[b] = time.Now()
	case left == reserveDry:
		tw.bare[b] = time.Time{} // no job left: none without a signal
	}
	left = max(left, 0)
	tw.avail[b] = left
	if status == reservePaused {
		tw.paused = true
		return false
	}
	if unsignalled && !tw.recheck[b] {
		tw.recheck[b] = true
		time.AfterFunc(strandedAfter, func() { w.lookStranded(topic, b) })
	}
	// Signals left with consumers of this process waiting: as many of
	// them as there are signals look now (plan sends them where signals
	// are left), rather than each waiting for a blocked call to hand it
	// one; their calls go together.
	if len(w.groups) == 1 {
		// One lane for every bucket: wherever their looks go, they go
		// there (on a Cluster a look may go to another bucket's lane).
		w.wokenTogetherLocked(topic, tw, b, left)
	}
	for ; left > 0 && len(tw.waiters) > 0; left-- {
		wt := tw.waiters[0]
		tw.waiters = tw.waiters[1:]
		wt.wake <- wakeUp{b: noSignal}
	}
	return false
}

// enlist makes wt a waiter of topic, so that a signal taken for the topic
// wakes it, and has the blocked calls wait for the topic if they do not.
func (w *waits) enlist(topic string, wt *waiter) {
	w.mu.Lock()
	tw := w.topicLocked(topic)
	if !slices.Contains(tw.waiters, wt) {
		tw.waiters = append(tw.waiters, wt)
	}
	// A signal taken while no consumer waited is held for the next to
	// come: the blocked calls would not take it again before it is given
	// back, nor hear when it is.
	for b, n := range tw.held {
		tw.held[b] = w.handLocked(topic, tw, b, n)
	}
	var poke []string
	if !tw.paused && len(tw.waiters) > 0 {
		for _, g := range w.groups {
			switch {
			case g.keys == nil:
				select {
				case g.changed <- struct{}{}:
				default:
				}
			case !g.waitsFor(topic) && !g.poked:
				g.poked = true
				poke = append(poke, g.poke)
			}
		}
	}
	w.mu.Unlock()
	w.poke(poke)
}

// leave takes wt off topic's waiters. A signal it was given and did not use
// goes to the next waiter, or is held.
func (w *waits) leave(topic string, wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topicLocked(topic)
	if i := slices.Index(tw.waiters, wt); i >= 0 {
		tw.waiters = slices.Delete(tw.waiters, i, i+1)
	}
	for {
		select {
		case u := <-wt.wake:
			if u.b >= 0 {
				w.deliverLocked(u.b, topic, u.n)
			}
		default:
			return
		}
	}
}

// unused hands on n signals (none: nothing) of bucket b that a consumer of
// topic took and did not use (its caller went away, or has enough).
func (w *waits) unused(topic string, b, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deliverLocked(b, topic, n)
}

// lookStranded has a waiting consumer of topic look at bucket b, where a
// reserve call took the last signal a while ago and none came since: a job
// whose signal was lost is taken there (reserve.lua). Jobs left without a
// signal are mostly those whose signals other processes took and are about
// to use: a list that ran dry since, as a reply of this process said, left
// no job behind, and one whose replies have said so for less than
// strandedAfter is looked at once they have said it that long: by a
// waiting consumer, or else by the next of the process's consumers to look.
func (w *waits) lookStranded(topic string, b int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topicLocked(topic)
	wait := time.Until(tw.quiet[b])
	if bare := time.Since(tw.bare[b]); !tw.bare[b].IsZero() && bare < strandedAfter {
		wait = max(wait, strandedAfter-bare)
	}
	if wait > 0 && w.ctx.Err() == nil {
		time.AfterFunc(wait, func() { w.lookStranded(topic, b) })
		return
	}
	tw.recheck[b] = false
	if w.ctx.Err() != nil || tw.bare[b].IsZero() || tw.paused || tw.avail[b] != 0 {
		return
	}
	tw.avail[b] = unknown // no consumer waiting: the next to look looks there (plan)
	tw.lost[b] = true
	if len(tw.waiters) == 0 {
		return
	}
	wt := tw.waiters[0]
	tw.waiters = tw.waiters[1:]
	wt.wake <- wakeUp{b: noSignal}
}

// lostLooked records how a look of topic for a lost signal at bucket b
// ended. When it found that another call had looked in the last second
// (unclaimed), this process's next look there comes othersLook later;
// unless that call was this process's own, as when consumers that start
// together all send a first look before the first reply.
func (w *waits) lostLooked(topic string, b int, unclaimed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.topicLocked(topic)
	switch {
	case !unclaimed:
		tw.looked[b] = time.Now()
	case time.Since(tw.looked[b]) >= strandedAfter:
		tw.quiet[b] = time.Now().Add(othersLook)
	}
}

// resume marks topic resumed: its consumers look again, and the blocked
// calls wait for it.
func (w *waits) resume(topic string) {
	w.mu.Lock()
	tw, ok := w.topics[topic]
	if !ok {
		w.mu.Unlock()
		return
	}
	tw.paused = false
	tw.resumes++
	for b := range tw.avail {
		tw.avail[b] = unknown
		tw.lost[b] = false
	}
	waiters := tw.waiters
	tw.waiters = nil
	w.mu.Unlock()
	for _, wt := range waiters {
		wt.wake <- wakeUp{b: noSignal} // a look
	}
}

// resumePaused has the consumers of every paused topic look again, as
// after a resume that may have been missed. Every topic counts a resume:
// the reply of a call sent before one that was missed must not pause it
// (settle).
func (w *waits) resumePaused() {
	w.mu.Lock()
	var topics []string
	for topic, tw := range w.topics {
		tw.resumes++
		if tw.paused {
			topics = append(topics, topic)
		}
	}
	w.mu.Unlock()
	for _, topic := range topics {
		w.resume(topic)
	}
}
