package delayqueue

// The torture's calls: workers that call the queue at random, and
// pausers. Each records what it called, when, and what came back.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// tortureWorker does random calls until the run ends.
type tortureWorker struct {
	m     *tortureModel
	qs    []*DelayQueue
	name  string
	rng   *rand.Rand
	held  []*tdelivery
	calls *atomic.Int64
}

func (w *tortureWorker) run(until time.Time) {
	for time.Now().Before(until) {
		w.calls.Add(1)
		if len(w.held) >= 3 || (len(w.held) > 0 && w.rng.IntN(100) < 40) {
			w.settle()
			continue
		}
		switch r := w.rng.IntN(100); {
		case r < 3:
			w.nap() // a slow consumer: what it holds may run out
		case r < 18:
			w.push()
		case r < 23:
			w.pushMany()
		case r < 33:
			w.upsert()
		case r < 40:
			w.reschedule()
		case r < 48:
			w.remove()
		case r < 76:
			w.pop()
		case r < 78:
			w.consume()
		case r < 88:
			w.get()
		default:
			w.finishByID()
		}
	}
	// Leave nothing reserved.
	for _, d := range w.held {
		w.settleWith(d, 80)
	}
}

func (w *tortureWorker) nap() {
	timer := time.NewTimer(time.Duration(30+w.rng.IntN(100)) * time.Millisecond)
	<-timer.C
}

func (w *tortureWorker) queue() (*DelayQueue, int, string) {
	i := w.rng.IntN(2)
	return w.qs[i], i, w.name + "/" + "ab"[i:i+1]
}

// instance is the instance of who: 0 for ".../a", 1 for ".../b".
func instance(who string) int {
	if strings.HasSuffix(who, "/b") {
		return 1
	}
	return 0
}

func (w *tortureWorker) topic() string { return tortureTopics[w.rng.IntN(len(tortureTopics))] }

func (w *tortureWorker) callerID() string { return fmt.Sprintf("c%02d", w.rng.IntN(tortureCallerIDs)) }

// anyID is an ID of a caller's, or one the queue generated lately.
func (w *tortureWorker) anyID() string {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	if n := len(w.m.recent); n > 0 && w.rng.IntN(100) < 35 {
		return w.m.recent[n-1-w.rng.IntN(min(n, 100))]
	}
	return w.callerID()
}

func (w *tortureWorker) smallDelay() time.Duration {
	return time.Duration(1+w.rng.IntN(250)) * time.Millisecond
}

// newJob makes a job with a body of its own, and registers the body.
func (w *tortureWorker) newJob(id string) (*Job, *tversion) {
	job := &Job{ID: id, Topic: w.topic(), Body: fmt.Appendf(nil, "b%d", w.m.bodies.Add(1))}
	switch r := w.rng.IntN(100); {
	case r < 40:
	case r < 80:
		job.Delay = w.smallDelay()
	default:
		job.RunAt = time.Now().Add(time.Duration(w.rng.IntN(300)-50) * time.Millisecond)
	}
	job.TTR = []time.Duration{0, 0, 60 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond}[w.rng.IntN(5)]
	job.MaxAttempts = []int{0, 1, 2, 3, 8}[w.rng.IntN(5)]
	max := job.MaxAttempts
	if max == 0 {
		max = w.qs[0].opts.maxAttempts
	}
	return job, w.m.version(job, max)
}

func (w *tortureWorker) describeJob(job *Job) string {
	s := fmt.Sprintf("topic=%s body=%s ttr=%v max=%d", job.Topic, job.Body, job.TTR, job.MaxAttempts)
	switch {
	case job.Delay > 0:
		s += fmt.Sprintf(" delay=%v", job.Delay)
	case !job.RunAt.IsZero():
		s += " runAt=" + w.m.ms(job.RunAt)
	}
	return s
}

func (w *tortureWorker) push() {
	id := ""
	if w.rng.IntN(2) == 0 {
		id = w.callerID()
	}
	job, v := w.newJob(id)
	q, _, who := w.queue()
	e := &tevent{kind: kPush, who: who, what: "Push " + w.describeJob(job), start: time.Now()}
	res, err := pushWithResult(context.Background(), q, job)
	e.end, e.err, e.existed, e.id = time.Now(), err, res.Existed, job.ID
	e.unexpected = err != nil
	w.m.stored(v, e)
}

func (w *tortureWorker) pushMany() {
	n := 2 + w.rng.IntN(4)
	jobs := make([]*Job, n)
	vs := make([]*tversion, n)
	for i := range jobs {
		id := ""
		if w.rng.IntN(2) == 0 {
			id = w.callerID()
		}
		jobs[i], vs[i] = w.newJob(id)
	}
	q, _, who := w.queue()
	start := time.Now()
	res, err := q.PushMany(context.Background(), jobs)
	end := time.Now()
	for i, job := range jobs {
		e := &tevent{kind: kPush, who: who, id: job.ID, start: start, end: end, err: err, unexpected: err != nil,
			what: fmt.Sprintf("PushMany[%d/%d] %s", i+1, n, w.describeJob(job))}
		if err == nil {
			e.existed = res[i].Existed
		}
		w.m.stored(vs[i], e)
	}
}

func (w *tortureWorker) upsert() {
	job, v := w.newJob(w.callerID())
	q, _, who := w.queue()
	e := &tevent{kind: kUpsert, who: who, id: job.ID, what: "Upsert " + w.describeJob(job), start: time.Now()}
	res, err := q.Upsert(context.Background(), job)
	e.end, e.err, e.existed = time.Now(), err, res.Existed
	e.unexpected = err != nil
	w.m.stored(v, e)
}

func (w *tortureWorker) reschedule() {
	id := w.anyID()
	delay := time.Duration(0)
	if w.rng.IntN(3) > 0 {
		delay = w.smallDelay()
	}
	q, _, who := w.queue()
	e := &tevent{kind: kReschedule, who: who, id: id, what: fmt.Sprintf("RescheduleIn %v", delay), start: time.Now()}
	err := q.RescheduleIn(context.Background(), id, delay)
	e.end, e.err = time.Now(), err
	e.unexpected = err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNotPending)
	w.m.add(e)
}

func (w *tortureWorker) remove() {
	id := w.anyID()
	q, _, who := w.queue()
	e := &tevent{kind: kRemove, who: who, id: id, what: "Remove", start: time.Now()}
	err := q.Remove(context.Background(), id)
	e.end, e.err = time.Now(), err
	e.unexpected = err != nil && !errors.Is(err, ErrNotFound)
	w.m.add(e)
}

func (w *tortureWorker) get() {
	id := w.anyID()
	q, _, who := w.queue()
	e := &tevent{kind: kGet, who: who, id: id, what: "Get", start: time.Now()}
	job, err := q.Get(context.Background(), id)
	e.end, e.err = time.Now(), err
	e.unexpected = err != nil && !errors.Is(err, ErrNotFound)
	if err == nil {
		e.body, e.state = string(job.Body), job.State
	}
	w.m.add(e)
}

// finishByID finishes an ID this worker does not hold: whatever
// reservation the job has, or the one its instance popped last.
func (w *tortureWorker) finishByID() {
	id := w.anyID()
	q, _, who := w.queue()
	e := &tevent{kind: kFinish, who: who, id: id, what: "Finish (not held)", start: time.Now()}
	err := q.Finish(context.Background(), id)
	e.end, e.err = time.Now(), err
	e.unexpected = err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNotReserved) && !errors.Is(err, ErrReservationLost)
	w.m.add(e)
}

func (w *tortureWorker) pop() {
	topic := w.topic()
	timeout := time.Duration(0)
	if w.rng.IntN(2) == 0 {
		timeout = time.Duration(10+w.rng.IntN(70)) * time.Millisecond
	}
	q, qi, who := w.queue()
	start := time.Now()
	job, err := q.Pop(context.Background(), topic, timeout)
	end := time.Now()
	w.m.mu.Lock()
	w.m.pops = append(w.m.pops, tpop{topic, start, end, err == nil})
	w.m.mu.Unlock()
	if err != nil {
		if !errors.Is(err, ErrNoJob) {
			w.m.mu.Lock()
			w.m.oddities = append(w.m.oddities, fmt.Sprintf("%s Pop %s: %v", who, topic, err))
			w.m.mu.Unlock()
		}
		return
	}
	d := &tdelivery{job: job, qi: qi}
	d.ev = &tevent{kind: kDeliver, who: who, id: job.ID, start: start, end: end, body: string(job.Body), del: d,
		what: fmt.Sprintf("Pop %s %v", topic, timeout)}
	w.m.delivered(d, topic)
	w.held = append(w.held, d)
}

// delivered records a delivery of a job popped from topic.
func (m *tortureModel) delivered(d *tdelivery, topic string) {
	d.deadline = d.job.ReservedUntil
	d.reserved = d.deadline.Add(-d.job.TTR)
	d.topic = topic
	m.add(d.ev)
}

// settle does something with a held reservation, at random.
func (w *tortureWorker) settle() {
	i := w.rng.IntN(len(w.held))
	d := w.held[i]
	if w.settleWith(d, w.rng.IntN(100)) {
		w.held = slices.Delete(w.held, i, i+1)
	}
}

// settleWith settles d as r says, and reports whether it is done with it.
func (w *tortureWorker) settleWith(d *tdelivery, r int) bool {
	ctx := context.Background()
	q, qi := w.qs[d.qi], d.qi
	job := d.job
	e := &tevent{who: w.name + "/" + "ab"[qi:qi+1], id: job.ID, del: d, start: time.Now()}
	var err error
	var expected []error
	switch {
	case r < 30:
		e.kind, e.what = kFinish, "Finish"
		if w.rng.IntN(10) == 0 { // the other instance: whatever reservation the job has
			q, qi = w.qs[1-qi], 1-qi
			e.who, e.what = w.name+"/"+"ab"[qi:qi+1], "Finish (other instance)"
		}
		e.start = time.Now()
		err = q.Finish(ctx, job.ID)
		expected = []error{ErrNotFound, ErrNotReserved, ErrReservationLost}
	case r < 45:
		cause := errors.New("torture")
		e.what = "Retry"
		switch w.rng.IntN(10) {
		case 0:
			cause, e.what = ErrSkipRetry, "Retry(ErrSkipRetry)"
		case 1:
			cause, e.what = Snooze(30*time.Millisecond), "Retry(Snooze 30ms)"
		}
		e.kind = kRetry
		err = q.Retry(ctx, job, cause)
		expected = []error{ErrNotFound, ErrReservationLost}
	case r < 60:
		delay := time.Duration(w.rng.IntN(120)) * time.Millisecond
		e.kind, e.what = kRetry, fmt.Sprintf("RetryAfter %v", delay)
		err = q.RetryAfter(ctx, job, delay, errors.New("torture"))
		expected = []error{ErrNotFound, ErrReservationLost}
	case r < 88:
		e.kind, e.what = kRelease, "Release"
		err = q.Release(ctx, job)
		expected = []error{ErrNotFound, ErrReservationLost}
	default:
		e.kind, e.what = kTouch, "Touch"
		err = q.Touch(ctx, job)
		expected = []error{ErrNotFound, ErrReservationLost}
	}
	e.end, e.err = time.Now(), err
	e.unexpected = err != nil && !slices.ContainsFunc(expected, func(x error) bool { return errors.Is(err, x) })
	if e.kind == kTouch && err == nil {
		e.what += " until " + w.m.ms(job.ReservedUntil)
	}
	w.m.mu.Lock()
	d.settles = append(d.settles, e)
	w.m.addLocked(e)
	w.m.mu.Unlock()
	if e.kind == kTouch {
		return false
	}
	// Now and then, settle it again: a call under a reservation already
	// settled must change nothing.
	if err == nil && e.kind != kFinish && w.rng.IntN(10) == 0 {
		w.settleWith(d, 45+w.rng.IntN(55))
	}
	return true
}

func (w *tortureWorker) consume() {
	q, qi, who := w.queue()
	topic := w.topic()
	c := &tconsumer{who: who, start: time.Now(), done: map[string][]*tdelivery{}}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), consumerKey{}, c),
		time.Duration(50+w.rng.IntN(200))*time.Millisecond)
	defer cancel()
	seed := w.rng.Uint64()
	var n atomic.Uint64
	handler := func(ctx context.Context, job *Job) error {
		rng := rand.New(rand.NewPCG(seed, n.Add(1)))
		d := &tdelivery{job: job, qi: qi, consume: true}
		d.ev = &tevent{kind: kDeliver, who: who, id: job.ID, start: c.start, end: time.Now(), body: string(job.Body), del: d,
			what: "Consume " + topic}
		w.m.delivered(d, topic)
		var err error
		switch r := rng.IntN(100); {
		case r < 65:
		case r < 85:
			err = errors.New("torture")
		case r < 95:
			err = RetryIn(20*time.Millisecond, errors.New("torture"))
		default:
			err = Snooze(10 * time.Millisecond)
		}
		pause := time.Duration(rng.IntN(20)) * time.Millisecond
		if job.TTR >= tortureKeptTTR && rng.IntN(10) == 0 {
			pause = job.TTR * 13 / 10 // Consume must extend the reservation
		}
		if pause > 0 {
			timer := time.NewTimer(pause)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
			}
		}
		w.m.mu.Lock()
		d.returned = time.Now()
		if err != nil {
			d.ev.what += fmt.Sprintf(" (handler returned %v)", err)
		} else {
			c.done[job.ID] = append(c.done[job.ID], d)
		}
		w.m.mu.Unlock()
		return err
	}
	err := q.Consume(ctx, topic, handler, ConsumeOptions{Concurrency: 1 + w.rng.IntN(3)})
	if err != nil {
		w.m.mu.Lock()
		w.m.oddities = append(w.m.oddities, fmt.Sprintf("%s Consume %s: %v", who, topic, err))
		w.m.mu.Unlock()
	}
}

// torturePauser pauses and resumes its topics, one at a time.
type torturePauser struct {
	m      *tortureModel
	qs     []*DelayQueue
	name   string
	topics []string
	rng    *rand.Rand
}

func (p *torturePauser) run(until time.Time) {
	ctx := context.Background()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	wait := func(d time.Duration) {
		timer.Reset(min(d, max(time.Until(until), 0)))
		<-timer.C
	}
	for time.Now().Before(until) {
		wait(time.Duration(100+p.rng.IntN(400)) * time.Millisecond)
		if !time.Now().Before(until) {
			return
		}
		topic := p.topics[p.rng.IntN(len(p.topics))]
		i := p.rng.IntN(2)
		w := &tpause{topic: topic, who: p.name + "/" + "ab"[i:i+1], paused: time.Now()}
		if err := p.qs[i].Pause(ctx, topic); err != nil {
			p.m.mu.Lock()
			p.m.oddities = append(p.m.oddities, fmt.Sprintf("%s Pause %s: %v", w.who, topic, err))
			p.m.mu.Unlock()
			continue
		}
		w.pausedAck = time.Now()
		p.m.mu.Lock()
		p.m.pauses = append(p.m.pauses, w)
		p.m.mu.Unlock()
		wait(time.Duration(1200+p.rng.IntN(1300)) * time.Millisecond)
		i = p.rng.IntN(2)
		p.m.mu.Lock()
		w.resume = time.Now()
		p.m.mu.Unlock()
		if err := p.qs[i].Resume(ctx, topic); err != nil {
			p.m.mu.Lock()
			p.m.oddities = append(p.m.oddities, fmt.Sprintf("%s Resume %s: %v", w.who, topic, err))
			p.m.mu.Unlock()
		}
	}
}
