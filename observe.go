package delayqueue

import (
	"context"
	"slices"
	"time"
)

// An Observer receives what the queue does, for metrics, tracing or logs
// (WithObserver). Observe is called synchronously, on the goroutine that
// did the thing: it must be quick, must not block, and must not call the
// queue. With no Observer set, the queue does no work for it.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc makes a function an Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// WithObserver adds an Observer to receive the queue's events. It may be
// given several times, as dqprom and dqotel each bring one: every Observer
// receives every event, in the order the options were given. A nil
// Observer adds nothing.
func WithObserver(o Observer) Option {
	if o == nil {
		return optionFunc(func(*options) {})
	}
	return optionFunc(func(opts *options) {
		switch prev := opts.observer.(type) {
		case nil:
			opts.observer = o
		case observers:
			opts.observer = append(slices.Clip(prev), o)
		default:
			opts.observer = observers{prev, o}
		}
	})
}

// observers feeds every event to each of several Observers.
type observers []Observer

func (os observers) Observe(ctx context.Context, e Event) {
	for _, o := range os {
		o.Observe(ctx, e)
	}
}

// EventKind says what an Event reports.
type EventKind int

const (
	// EventPushed: a push or upsert stored a job (Existed: it was there).
	EventPushed EventKind = iota + 1
	// EventMoved: a bucket handler made Count due jobs of Topic ready.
	EventMoved
	// EventReserved: a Pop or Consume reserved a job; Lateness says how
	// long after its due time.
	EventReserved
	// EventFinished: a job was finished.
	EventFinished
	// EventRetried: a job was retried; Err is the cause.
	EventRetried
	// EventDead: a job went to the dead letters through Retry or a
	// handler's error; Err is the cause.
	EventDead
	// EventHandled: a Consume handler returned; Duration is how long it
	// ran, Err what it returned (a panic as an error).
	EventHandled
	// EventReserveCall: a reserve call went to one bucket's ready list of
	// Topic for consumers of this process; Count is how many jobs it
	// reserved. A call that found none was work for nothing: many of them
	// say that consumers are woken for jobs others took (Unclaimed: it
	// came only to claim signals, and cost a few commands).
	EventReserveCall
	// EventTick: a schedule's tick came and the schedule was advanced (the
	// tick's job was pushed ahead of it, JobID); Count is how many ticks
	// came, Missed how many were skipped after an outage.
	EventTick
	// EventLimited: a consumer of Topic waits at the topic's limits (see
	// SetLimits) until capacity returns.
	EventLimited
	// EventSnoozed: a job was put back by Snooze, its attempt not counted;
	// its EventHandled (under Consume) carries the SnoozeError.
	EventSnoozed
	// EventTickFailed: the next tick of a schedule could not be computed
	// (Err says why: a zone this process cannot load, say). That schedule
	// pushes nothing and is tried again a minute later (Schedules gives
	// that time as its Next); the bucket's jobs and other schedules go on.
	EventTickFailed
)

// An Event is one thing the queue did. Which fields are set depends on
// Kind; Topic always is.
type Event struct {
	Kind    EventKind
	Topic   string
	JobID   string // all but EventMoved
	Attempt int    // EventReserved, EventHandled, EventRetried, EventDead: the delivery's attempt
	Count   int    // EventMoved, EventReserveCall, EventTick
	// Finishes is EventReserveCall's: how many finishes rode on the call
	// (Consume's, and Finish calls made meanwhile). A call that found no
	// job but carried finishes did a finish's work all the same.
	Finishes int
	// Schedule and Missed are EventTick's: the schedule's name (also
	// EventTickFailed's), and how many of its ticks came while no process
	// fired it.
	Schedule string
	Missed   int
	Existed  bool // EventPushed
	// Unclaimed is EventReserveCall's: the call came only for ready
	// signals that another call's reply said were left, and found that
	// other processes had taken them; or it came to look for a job whose
	// signal was lost, and found that another process had looked in the
	// last second. It read only the list's length: it cost Redis a few
	// commands, not a look at the list.
	Unclaimed bool
	// Lateness is, for EventReserved, the start of the reservation less
	// the job's due time, both on the Redis server's clock; -1 when the due
	// time is not known (a reserve call re-sent after a lost reply).
	Lateness time.Duration
	Duration time.Duration // EventHandled
	Err      error         // EventHandled, EventRetried, EventDead, EventTickFailed
}

// observe reports e when an Observer is set.
func (q *DelayQueue) observe(ctx context.Context, e Event) {
	q.tally.note(e)
	if q.opts.observer != nil {
		q.opts.observer.Observe(ctx, e)
	}
}

// observeReserved reports the jobs a reserve call returned.
func (q *DelayQueue) observeReserved(ctx context.Context, jobs []*Job) {
	if q.opts.observer == nil && !q.tally.on.Load() {
		return
	}
	for _, job := range jobs {
		late := time.Duration(-1)
		if !job.dueAt.IsZero() {
			late = job.ReservedUntil.Add(-job.TTR).Sub(job.dueAt)
		}
		q.observe(ctx, Event{Kind: EventReserved, Topic: job.Topic, JobID: job.ID,
			Attempt: job.Attempts, Lateness: late})
	}
}
