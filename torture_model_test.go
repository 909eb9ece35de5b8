package delayqueue

// The torture's record of calls, and what it concludes from it about
// each job.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tkind is the kind of a recorded call.
type tkind int

const (
	kPush          tkind = iota + 1 // Push or PushMany
	kUpsert                         // Upsert
	kRemove                         // Remove
	kFinish                         // Finish, by a worker
	kConsumeFinish                  // Consume finished its handler's job (seen by the Observer)
	kReschedule                     // RescheduleIn
	kGet                            // Get
	kDeliver                        // Pop returned the job, or Consume ran a handler on it
	kRetry                          // Retry or RetryAfter
	kRelease                        // Release
	kTouch                          // Touch
)

// tevent is one recorded call, as it concerns one job ID.
type tevent struct {
	kind       tkind
	who        string // worker, and instance a or b
	qi         int    // the instance: 0 (a) or 1 (b)
	id         string
	start, end time.Time
	err        error
	unexpected bool       // err is none of those the call's doc names
	body       string     // push, upsert: the body written; deliver, get: the body read
	existed    bool       // push, upsert: PushResult.Existed
	state      State      // get: the state read
	del        *tdelivery // deliver, and its holder's settling calls
	what       string     // the call, for the history
}

// stores reports whether the call stored its body as the job's.
func (e *tevent) stores() bool {
	switch e.kind {
	case kPush:
		return e.err == nil && !e.existed
	case kUpsert:
		return e.err == nil
	}
	return false
}

// creates reports whether the call created the job: it did not exist.
func (e *tevent) creates() bool {
	return (e.kind == kPush || e.kind == kUpsert) && e.err == nil && !e.existed
}

// deletes reports whether the call certainly deleted the job.
func (e *tevent) deletes() bool {
	switch e.kind {
	case kRemove, kFinish:
		return e.err == nil
	case kConsumeFinish:
		return true
	}
	return false
}

// mayDelete reports whether the call may have deleted the job.
func (e *tevent) mayDelete() bool {
	return e.deletes() || (e.unexpected && (e.kind == kRemove || e.kind == kFinish))
}

// mayCreate reports whether the call may have created the job.
func (e *tevent) mayCreate() bool {
	return e.creates() || (e.unexpected && (e.kind == kPush || e.kind == kUpsert))
}

// kills reports whether the call certainly ended every earlier body of
// the job: a deletion, a replacement, or a creation (the ID was free).
func (e *tevent) kills() bool {
	return e.deletes() || e.stores()
}

// disturbs reports whether the call may have ended a reservation of the
// job other than by its holder: a deletion, an Upsert, or a call that
// failed in a way nobody expected.
func (e *tevent) disturbs() bool {
	return e.mayDelete() || (e.kind == kUpsert && (e.err == nil || e.unexpected)) || e.unexpected
}

// tversion is one body a push or upsert wrote under an ID.
type tversion struct {
	body   string
	id     string
	topic  string
	max    int // MaxAttempts in effect
	delay  time.Duration
	runAt  time.Time
	create *tevent
}

// tdelivery is one delivery: a reservation Pop returned, or Consume ran.
type tdelivery struct {
	ev       *tevent // start: Pop's or Consume's start; end: Pop's return, or the handler's start
	job      *Job
	topic    string // the topic popped
	qi       int
	consume  bool
	reserved time.Time // on the server's clock
	deadline time.Time // the reservation's end as delivered, on the server's clock
	returned time.Time // consume: when the handler returned
	settles  []*tevent // the holder's calls on the reservation
}

// tpause is one pause of a topic, from Pause's call to Resume's.
type tpause struct {
	topic                     string
	who                       string
	paused, pausedAck, resume time.Time // resume: zero while paused
}

// tpop is one Pop call.
type tpop struct {
	topic      string
	start, end time.Time
	got        bool
}

// tconsumer is one Consume call.
type tconsumer struct {
	who   string
	start time.Time
	// done holds, by job ID, the deliveries whose handlers returned nil,
	// in order, until the Observer sees a finish of the ID.
	done map[string][]*tdelivery
}

type consumerKey struct{}

// tortureModel records every call.
type tortureModel struct {
	t0       time.Time
	bodies   atomic.Int64
	mu       sync.Mutex
	events   map[string][]*tevent // by job ID
	versions map[string]*tversion // by body
	recent   []string             // generated IDs, for calls by ID
	pauses   []*tpause
	pops     []tpop   // every Pop, for the figures
	oddities []string // calls that returned what no doc allows
}

func newTortureModel() *tortureModel {
	return &tortureModel{t0: time.Now(), events: map[string][]*tevent{}, versions: map[string]*tversion{}}
}

func (m *tortureModel) add(e *tevent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addLocked(e)
}

func (m *tortureModel) addLocked(e *tevent) {
	e.qi = instance(e.who)
	m.events[e.id] = append(m.events[e.id], e)
	if e.unexpected {
		m.oddities = append(m.oddities, fmt.Sprintf("%s: %v", m.describe(e), e.err))
	}
}

// version registers the body a push or upsert is about to write.
func (m *tortureModel) version(job *Job, max int) *tversion {
	v := &tversion{body: string(job.Body), id: job.ID, topic: job.Topic, max: max, delay: job.Delay, runAt: job.RunAt}
	m.mu.Lock()
	m.versions[v.body] = v
	m.mu.Unlock()
	return v
}

// stored records a push or upsert of v.
func (m *tortureModel) stored(v *tversion, e *tevent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v.id, v.create, e.body = e.id, e, v.body
	if e.err == nil && generated(e.id) && !e.existed {
		m.recent = append(m.recent, e.id)
		if len(m.recent) > 400 {
			m.recent = slices.Delete(m.recent, 0, 200)
		}
	}
	m.addLocked(e)
}

// observe sees the finishes of Consume's handlers' jobs.
func (m *tortureModel) observe(ctx context.Context, e Event) {
	c, ok := ctx.Value(consumerKey{}).(*tconsumer)
	if !ok || e.Kind != EventFinished {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The event does not say which reservation was finished: it began
	// after the first handler of the ID that returned nil and is not
	// matched yet, whose own finish may have failed (the earliest start is
	// the safe one).
	ev := &tevent{kind: kConsumeFinish, who: c.who, id: e.JobID, start: c.start, end: time.Now(), what: "Consume finished it"}
	if done := c.done[e.JobID]; len(done) > 0 {
		ev.start, ev.what = done[0].returned, fmt.Sprintf("Consume finished it (after a handler of reservation %d or later)", done[0].job.reservation)
		c.done[e.JobID] = done[1:]
	}
	m.addLocked(ev)
}

func (m *tortureModel) ms(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%.1fms", float64(t.Sub(m.t0).Microseconds())/1000)
}

// describe is one line of a job's history.
func (m *tortureModel) describe(e *tevent) string {
	out := "ok"
	switch {
	case e.err != nil:
		out = e.err.Error()
	case e.kind == kPush || e.kind == kUpsert:
		out = fmt.Sprintf("ok existed=%v", e.existed)
	case e.kind == kGet:
		out = fmt.Sprintf("ok %v body=%s", e.state, e.body)
	}
	var extra string
	if d := e.del; d != nil && e.kind == kDeliver {
		extra = fmt.Sprintf(" body=%s attempts=%d reservation=%d reserved=%s deadline=%s", e.body, d.job.Attempts,
			d.job.reservation, m.ms(d.reserved), m.ms(d.deadline))
		if d.consume {
			extra += " handler returned " + m.ms(d.returned)
		}
	} else if d != nil {
		extra = fmt.Sprintf(" (of reservation %d)", d.job.reservation)
	}
	return fmt.Sprintf("%10s..%-10s %-7s %s %q -> %s%s", m.ms(e.start), m.ms(e.end), e.who, e.what, e.id, out, extra)
}

// history is the recorded calls on id, in order of start, around from..to.
func (m *tortureModel) history(id string, from, to time.Time) string {
	evs := slices.Clone(m.events[id])
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].start.Before(evs[j].start) })
	var lines []string
	skipped := 0
	for _, e := range evs {
		if !from.IsZero() && (e.end.Before(from.Add(-2*time.Second)) || e.start.After(to.Add(time.Second))) {
			skipped++
			continue
		}
		lines = append(lines, "    "+m.describe(e))
	}
	if len(lines) > 80 {
		skipped += len(lines) - 80
		lines = lines[len(lines)-80:]
	}
	head := fmt.Sprintf("  history of %q (times since the run began):", id)
	if skipped > 0 {
		head += fmt.Sprintf(" (%d calls further away left out)", skipped)
	}
	return head + "\n" + strings.Join(lines, "\n")
}
