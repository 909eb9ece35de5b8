package delayqueue

// The torture's checks of each job's record: what the calls returned,
// judged against what the docs promise, whatever order the overlapping
// calls ran in.

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// figures says what the run did, to show what the checks had to judge.
func (m *tortureModel) figures() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var pops, consumed, again, lost, finished, removed, created, replaced int
	for _, evs := range m.events {
		for _, e := range evs {
			switch {
			case e.kind == kDeliver && e.del.consume:
				consumed++
			case e.kind == kDeliver:
				pops++
			case errors.Is(e.err, ErrReservationLost):
				lost++
			case e.kind == kFinish && e.err == nil, e.kind == kConsumeFinish:
				finished++
			case e.kind == kRemove && e.err == nil:
				removed++
			case e.creates():
				created++
			case e.kind == kUpsert && e.err == nil:
				replaced++
			}
			if e.kind == kDeliver && e.del.job.Attempts > 1 {
				again++
			}
		}
	}
	held := 0
	for _, p := range m.pops {
		for _, w := range m.pauses {
			if w.topic == p.topic && p.start.After(w.pausedAck.Add(torturePauseBound)) && (w.resume.IsZero() || p.end.Before(w.resume)) {
				held++
			}
		}
	}
	return fmt.Sprintf("%d jobs created, %d replaced by Upsert; %d delivered by Pop and %d by Consume (%d a second time or more); "+
		"%d finished, %d removed; %d calls met ErrReservationLost; %d pauses, in which %d Pops had to wait",
		created, replaced, pops, consumed, again, finished, removed, lost, len(m.pauses), held)
}

// check checks every job's record, and the pauses.
func (m *tortureModel) check(r *tortureReport) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.events {
		newJobCheck(m, r, id).run()
	}
	for id, evs := range m.events {
		for _, e := range evs {
			if e.kind == kDeliver {
				m.checkPaused(r, id, e)
			}
		}
	}
}

// checkPaused: no delivery of a topic paused, by a Pause that returned
// more than torturePauseBound before the Pop started (for Consume: before
// torturePauseBound and the slack of its reserve call), and not resumed
// before the job was delivered.
func (m *tortureModel) checkPaused(r *tortureReport, id string, e *tevent) {
	d := e.del
	for _, p := range m.pauses {
		if p.topic != d.topic {
			continue
		}
		looked := e.start
		if d.consume {
			looked = e.end.Add(-tortureConsumeSlack)
		}
		if looked.After(p.pausedAck.Add(torturePauseBound)) && (p.resume.IsZero() || e.end.Before(p.resume)) {
			r.add(id, e.start, e.end, "%s delivered it although %s paused topic %s at %s..%s, more than %v before, and resumed it at %s",
				e.what, p.who, p.topic, m.ms(p.paused), m.ms(p.pausedAck), torturePauseBound, m.ms(p.resume))
		}
	}
}

// jobCheck checks the record of one job ID. Its indexes keep the checks
// of a soak run's long records short.
type jobCheck struct {
	m   *tortureModel
	r   *tortureReport
	id  string
	evs []*tevent // by start

	maxDur time.Duration // the longest call
	acked  []*tversion   // stored by calls that returned nil, by the start of the call
	dels   []*tevent     // certain deletions, by start
	kills  []*tevent     // calls that ended every earlier body, by start
	killBy []time.Time   // killBy[i]: the earliest end among kills[i:]
	tries  []*tdelivery  // deliveries, by reservation
}

func newJobCheck(m *tortureModel, r *tortureReport, id string) *jobCheck {
	c := &jobCheck{m: m, r: r, id: id, evs: slices.Clone(m.events[id])}
	slices.SortStableFunc(c.evs, func(a, b *tevent) int { return a.start.Compare(b.start) })
	for _, e := range c.evs {
		c.maxDur = max(c.maxDur, e.end.Sub(e.start))
		if e.stores() {
			c.acked = append(c.acked, m.versions[e.body])
		}
		if e.deletes() {
			c.dels = append(c.dels, e)
		}
		if e.kills() {
			c.kills = append(c.kills, e)
		}
		if e.kind == kDeliver {
			c.tries = append(c.tries, e.del)
		}
	}
	c.killBy = make([]time.Time, len(c.kills))
	for i := len(c.kills) - 1; i >= 0; i-- {
		c.killBy[i] = c.kills[i].end
		if i+1 < len(c.kills) && c.killBy[i+1].Before(c.killBy[i]) {
			c.killBy[i] = c.killBy[i+1]
		}
	}
	slices.SortStableFunc(c.tries, func(a, b *tdelivery) int { return int(a.job.reservation - b.job.reservation) })
	return c
}

func (c *jobCheck) add(from, to time.Time, format string, args ...any) {
	c.r.add(c.id, from, to, format, args...)
}

// any reports whether a call for which pred holds overlaps from..to: it
// returned after from and started before to.
func (c *jobCheck) any(from, to time.Time, pred func(*tevent) bool) bool {
	i, _ := slices.BinarySearchFunc(c.evs, from.Add(-c.maxDur-time.Nanosecond), func(e *tevent, t time.Time) int { return e.start.Compare(t) })
	for ; i < len(c.evs) && c.evs[i].start.Before(to); i++ {
		if e := c.evs[i]; e.end.After(from) && pred(e) {
			return true
		}
	}
	return false
}

// mustExist returns a version that certainly existed from start to end:
// stored before start, and no call (other than self) that may have
// deleted it since. nil when none did. The latest stored before start is
// the one to look at: a deletion that excuses it excuses every earlier one.
func (c *jobCheck) mustExist(start, end time.Time, self *tevent) *tversion {
	var v *tversion
	for _, w := range c.acked {
		if w.create != self && w.create.end.Before(start) && (v == nil || w.create.start.After(v.create.start)) {
			v = w
		}
	}
	if v == nil || c.any(v.create.start, end, func(d *tevent) bool { return d != self && d.mayDelete() }) {
		return nil
	}
	return v
}

// mustBeAbsent returns a deletion after which the ID certainly did not
// exist from start to end: it returned before start, and no call that
// may have created the job again started before end and returned after
// the deletion began. nil when there is none. The deletion that started
// last is the one to look at.
func (c *jobCheck) mustBeAbsent(start, end time.Time, self *tevent) *tevent {
	var d *tevent
	for _, x := range c.dels {
		if x != self && x.end.Before(start) && (d == nil || x.start.After(d.start)) {
			d = x
		}
	}
	if d == nil || c.any(d.start, end, func(x *tevent) bool { return x != self && x.mayCreate() }) {
		return nil
	}
	return d
}

// killedBetween returns a call that started after from and returned
// before to, and ended every body stored before it; nil when none did.
func (c *jobCheck) killedBetween(from, to time.Time) *tevent {
	i, _ := slices.BinarySearchFunc(c.kills, from, func(e *tevent, t time.Time) int {
		if e.start.After(t) {
			return 1
		}
		return -1
	})
	if i == len(c.kills) || !c.killBy[i].Before(to) {
		return nil
	}
	for ; ; i++ {
		if c.kills[i].end.Before(to) {
			return c.kills[i]
		}
	}
}

// disturbed reports whether a call other than d's own (and except) may
// have ended d's reservation between from and to.
func (c *jobCheck) disturbed(d *tdelivery, from, to time.Time, except *tevent) bool {
	return c.any(from, to, func(x *tevent) bool { return x.del != d && x != except && x.disturbs() })
}

// found reports whether a call found the job: it did something to it,
// read it, or was refused for the state it found it in.
func (e *tevent) found() bool {
	switch {
	case errors.Is(e.err, ErrNotPending), errors.Is(e.err, ErrNotReserved), errors.Is(e.err, ErrReservationLost):
		return true
	case e.err != nil:
		return false
	}
	switch e.kind {
	case kGet, kRemove, kFinish, kReschedule, kDeliver, kTouch, kRetry, kRelease:
		return true
	case kPush:
		return e.existed && !generated(e.id)
	case kUpsert:
		return e.existed
	}
	return false
}

func (c *jobCheck) run() {
	m := c.m
	for _, e := range c.evs {
		if errors.Is(e.err, ErrNotFound) {
			if v := c.mustExist(e.start, e.end, e); v != nil {
				c.add(v.create.start, e.end, "%s at %s returned ErrNotFound, but body %s (%s at %s) existed: no call could have deleted it",
					e.what, m.ms(e.start), v.body, v.create.what, m.ms(v.create.end))
			}
		}
		if e.creates() {
			if v := c.mustExist(e.start, e.end, e); v != nil {
				c.add(v.create.start, e.end, "%s at %s created a job (Existed false), but body %s (%s at %s) existed: no call could have deleted it",
					e.what, m.ms(e.start), v.body, v.create.what, m.ms(v.create.end))
			}
		}
		if e.found() {
			if d := c.mustBeAbsent(e.start, e.end, e); d != nil {
				c.add(d.start, e.end, "%s at %s found the job, but %s deleted it at %s..%s and no call could have created it again",
					e.what, m.ms(e.start), d.what, m.ms(d.start), m.ms(d.end))
			}
		}
		if (e.kind == kDeliver || e.kind == kGet) && e.err == nil {
			c.checkBody(e)
		}
	}
	c.checkDeletions()
	early := map[string]bool{}
	for i, d := range c.tries {
		c.checkReservation(i, d)
		if v := m.versions[d.ev.body]; v != nil && !early[v.body] {
			early[v.body] = true
			c.checkNotEarly(d, v)
		}
	}
}

// checkBody: a delivery or Get returns a body pushed under the ID, that
// no call had ended before it started, with the topic and attempts it may
// have.
func (c *jobCheck) checkBody(e *tevent) {
	m := c.m
	v := m.versions[e.body]
	switch {
	case v == nil || v.id != c.id:
		c.add(e.start, e.end, "%s returned body %s, which was never pushed under this ID", e.what, e.body)
		return
	case !v.create.stores() && !v.create.unexpected:
		c.add(v.create.start, e.end, "%s returned body %s, which %s did not store (%v, existed=%v)",
			e.what, e.body, v.create.what, v.create.err, v.create.existed)
		return
	}
	if k := c.killedBetween(v.create.end, e.start); k != nil {
		c.add(v.create.start, e.end, "%s at %s returned body %s, which %s ended at %s..%s",
			e.what, m.ms(e.start), e.body, k.what, m.ms(k.start), m.ms(k.end))
	}
	if e.kind != kDeliver {
		return
	}
	job := e.del.job
	if job.Topic != v.topic || e.del.topic != v.topic {
		c.add(v.create.start, e.end, "%s delivered body %s as a job of topic %s; it was pushed to %s", e.what, e.body, job.Topic, v.topic)
	}
	if job.Attempts < 1 || job.Attempts > v.max {
		c.add(v.create.start, e.end, "%s delivered body %s at attempt %d; it may have 1 to %d", e.what, e.body, job.Attempts, v.max)
	}
}

// checkDeletions: a job is deleted (finished or removed) once. Between two
// deletions, a call must have created it again.
func (c *jobCheck) checkDeletions() {
	dels := slices.Clone(c.dels)
	slices.SortFunc(dels, func(a, b *tevent) int { return a.end.Compare(b.end) })
	for i := 1; i < len(dels); i++ {
		a, b := dels[i-1], dels[i]
		from, to := a.start, b.end
		if b.start.Before(from) {
			from = b.start
		}
		if !c.any(from, to, (*tevent).mayCreate) {
			c.add(from, to, "deleted twice, by %s at %s..%s and %s at %s..%s, with no push in between",
				a.what, c.m.ms(a.start), c.m.ms(a.end), b.what, c.m.ms(b.start), c.m.ms(b.end))
		}
	}
}

// settledAt is when d's holder began to give it back: its first Finish,
// Retry or Release (whatever it returned), or, under Consume, when the
// handler returned. Zero when it never did.
func settledAt(d *tdelivery) time.Time {
	if d.consume {
		return d.returned
	}
	for _, s := range d.settles {
		if s.kind != kTouch {
			return s.start
		}
	}
	return time.Time{}
}

// checkReservation: while the reservation of c.tries[i] holds (until its
// holder settles it or its deadline, unless another call ended it), nobody
// else receives the job, and the calls that may not touch a reserved job
// do not; the holder's own calls succeed, and once the reservation was
// settled, or a later one taken, its calls under it fail.
func (c *jobCheck) checkReservation(i int, d *tdelivery) {
	m := c.m
	settled := settledAt(d)
	// Reservations are numbered in the order they were taken, on the
	// server's clock. Consume extends the reservations of the handlers it
	// runs, until they return.
	deadline := d.deadline
	if d.consume && d.job.TTR >= tortureKeptTTR && d.returned.After(deadline) {
		deadline = d.returned
	}
	for _, x := range c.tries[i+1:] {
		if !x.reserved.Before(deadline) {
			break
		}
		if (settled.IsZero() || !settled.Before(x.ev.end)) && !c.disturbed(d, d.ev.start, x.ev.end, nil) {
			c.add(d.ev.start, x.ev.end, "%s (reservation %d, at %s) delivered it while reservation %d (%s) held until %s, not settled and not disturbed",
				x.ev.what, x.job.reservation, m.ms(x.reserved), d.job.reservation, d.ev.what, m.ms(deadline))
		}
	}
	validEnd := d.deadline.Add(-tortureMargin)
	if !settled.IsZero() && settled.Before(validEnd) {
		validEnd = settled
	}
	c.any(d.ev.end, validEnd, func(x *tevent) bool {
		if x.del == d || !x.start.After(d.ev.end) || !x.end.Before(validEnd) || c.disturbed(d, d.ev.start, x.end, x) {
			return false
		}
		switch {
		case x.kind == kGet && x.err == nil && (x.state != StateReserved || x.body != d.ev.body):
			c.add(d.ev.start, x.end, "%s read it as %v with body %s while %s held it (reservation %d, until %s)",
				x.what, x.state, x.body, d.ev.what, d.job.reservation, m.ms(d.deadline))
		case x.kind == kReschedule && x.err == nil:
			c.add(d.ev.start, x.end, "%s moved it while %s held it (reservation %d, until %s); a reserved job is not pending",
				x.what, d.ev.what, d.job.reservation, m.ms(d.deadline))
		}
		return false
	})
	if d.consume {
		return
	}
	// The holder's calls.
	deadline = d.deadline
	var ended *tevent
	for _, s := range d.settles {
		switch {
		case ended != nil && ended.err == nil && s.kind != kFinish && s.err == nil:
			c.add(d.ev.start, s.end, "%s succeeded under reservation %d, which %s had settled at %s",
				s.what, d.job.reservation, ended.what, m.ms(ended.end))
		case ended == nil && s.err != nil && s.end.Add(tortureMargin).Before(deadline) && !c.disturbed(d, d.ev.start, s.end, nil) &&
			(s.kind != kFinish || !c.heldElse(i, d, s)):
			c.add(d.ev.start, s.end, "%s at %s..%s returned %v, but reservation %d held until %s and no call could have ended it",
				s.what, m.ms(s.start), m.ms(s.end), s.err, d.job.reservation, m.ms(deadline))
		}
		// Once a later reservation was taken, this one is stale.
		if x := c.takenBefore(i, s.start); x != nil && s.err == nil && c.staleMustFail(i, d, s) {
			c.add(d.ev.start, s.end, "%s at %s..%s succeeded under reservation %d, but %s took reservation %d before (at %s)",
				s.what, m.ms(s.start), m.ms(s.end), d.job.reservation, x.ev.what, x.job.reservation, m.ms(x.reserved))
		}
		switch {
		case s.kind == kTouch && s.err == nil && ended == nil:
			if until := s.start.Add(d.job.TTR).Truncate(time.Millisecond); until.After(deadline) {
				deadline = until
			}
		case s.kind != kTouch && ended == nil:
			ended = s
		}
	}
}

// popsAfter reports whether, before t, the instance qi's Pop returned the
// job under a reservation other than c.tries[i]'s that is later (later:
// true) or any.
func (c *jobCheck) popsAfter(i, qi int, t time.Time, later bool) bool {
	from := 0
	if later {
		from = i + 1
	}
	for j, y := range c.tries[from:] {
		if later && y.reserved.After(t.Add(time.Second)) {
			break // reserved after t, on any clock
		}
		if from+j != i && !y.consume && y.qi == qi && y.ev.start.Before(t) {
			return true
		}
	}
	return false
}

// heldElse reports whether s, a Finish of d's holder, may have checked a
// reservation other than d's: Finish checks the reservation of the job
// that its instance popped last (settle_held.go), which is d's on d's instance
// unless it popped the job again, and on the other instance is any it
// popped before.
func (c *jobCheck) heldElse(i int, d *tdelivery, s *tevent) bool {
	return c.popsAfter(i, s.qi, s.end, s.qi == d.qi)
}

// takenBefore returns a delivery of the job under a later reservation
// than c.tries[i]'s that Pop or Consume returned before t, or nil.
func (c *jobCheck) takenBefore(i int, t time.Time) *tdelivery {
	for _, x := range c.tries[i+1:] {
		if x.reserved.After(t.Add(time.Second)) {
			break
		}
		if x.ev.end.Before(t) {
			return x
		}
	}
	return nil
}

// staleMustFail reports whether s, a call of d's holder made after a
// later reservation was taken, must fail. Retry, Release and Touch check
// d's reservation. Finish checks the reservation that d's instance popped
// last (settle_held.go), which is d's unless the instance popped the job again,
// or forgot d's (a Remove or another Finish of the ID on that instance);
// on the other instance it finishes whatever reservation the job has.
func (c *jobCheck) staleMustFail(i int, d *tdelivery, s *tevent) bool {
	switch {
	case s.kind != kFinish:
		return true
	case s.qi != d.qi || c.popsAfter(i, d.qi, s.end, true):
		return false
	}
	return !c.any(d.ev.start, s.end, func(x *tevent) bool {
		return x != s && x.qi == d.qi && (x.kind == kRemove || x.kind == kFinish)
	})
}

// checkNotEarly: the first delivery of a body comes no earlier than its
// due time, unless a RescheduleIn may have moved it.
func (c *jobCheck) checkNotEarly(d *tdelivery, v *tversion) {
	if !v.create.stores() {
		return
	}
	if c.any(v.create.start, d.ev.end, func(x *tevent) bool { return x.kind == kReschedule }) {
		return
	}
	due := v.create.start.Add(v.delay)
	if !v.runAt.IsZero() {
		due = v.runAt
	}
	if d.reserved.UnixMilli() < due.UnixMilli()-1 {
		c.add(v.create.start, d.ev.end, "%s reserved body %s at %s, before it was due at %s",
			d.ev.what, v.body, c.m.ms(d.reserved), c.m.ms(due))
	}
}
