package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an Observer that keeps the events.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) Observe(_ context.Context, e Event) {
	if e.Kind == EventReserveCall {
		return // one per reserve call, not per step of a job
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *recorder) kinds() []EventKind {
	var out []EventKind
	for _, e := range r.all() {
		out = append(out, e.Kind)
	}
	return out
}

func TestObserverSeesEachStepAndTheLatenessOnTheServerClock(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	q, _, _, advance := clockQueue(t, WithObserver(rec), WithBackoff(BackoffSchedule(0)))
	id := pushed(t, q, &Job{ID: "j", Topic: "t", Delay: time.Minute})
	advance(time.Minute + 250*time.Millisecond)
	_, err := q.moveDue(ctx, 0, "token", false) // as the bucket handler does; it reports nothing itself
	require.NoError(t, err)
	job, err := q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	require.NoError(t, q.Retry(ctx, job, errors.New("busy")))
	job, err = q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	require.NoError(t, q.Retry(ctx, job, fmt.Errorf("gone: %w", ErrSkipRetry)))
	pushed(t, q, &Job{ID: "j", Topic: "t"}) // dead, but its ID exists
	pushed(t, q, &Job{ID: "k", Topic: "t"})
	job, err = q.Pop(ctx, "t", 0)
	require.NoError(t, err)
	require.NoError(t, q.Finish(ctx, job.ID))

	assert.Equal(t, []EventKind{EventPushed, EventReserved, EventRetried, EventReserved, EventDead,
		EventPushed, EventPushed, EventReserved, EventFinished}, rec.kinds())
	ev := rec.all()
	assert.Equal(t, Event{Kind: EventPushed, Topic: "t", JobID: id}, ev[0])
	assert.Equal(t, Event{Kind: EventReserved, Topic: "t", JobID: id, Attempt: 1, Lateness: 250 * time.Millisecond}, ev[1],
		"reserved 250ms after its due time, on the server's clock")
	assert.Equal(t, Event{Kind: EventRetried, Topic: "t", JobID: id, Attempt: 1, Err: errors.New("busy")}, ev[2])
	assert.Equal(t, time.Duration(0), ev[3].Lateness, "ready again at once, reserved at once")
	assert.Equal(t, EventDead, ev[4].Kind)
	assert.ErrorIs(t, ev[4].Err, ErrSkipRetry)
	assert.True(t, ev[5].Existed)
	assert.Equal(t, Event{Kind: EventFinished, Topic: "t", JobID: "k"}, ev[8])
}

func TestObserverSeesMovesAndHandlersUnderConsume(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		rec := &recorder{}
		q := newQueue(t, be.client, WithObserver(rec))
		startQueue(t, q)
		pushed(t, q, &Job{Topic: "t", Delay: 20 * time.Millisecond})
		// The move's event comes from the bucket handler once the move
		// returns, and may come after the job was handled and finished.
		consumeUntil(t, q, func(context.Context, *Job) error { return nil }, ConsumeOptions{}, func() bool {
			kinds := rec.kinds()
			return slices.Contains(kinds, EventFinished) && slices.Contains(kinds, EventMoved)
		})
		kinds := rec.kinds()
		for _, k := range []EventKind{EventPushed, EventMoved, EventReserved, EventHandled, EventFinished} {
			assert.Contains(t, kinds, k)
		}
		for _, e := range rec.all() {
			switch e.Kind {
			case EventMoved:
				assert.Equal(t, Event{Kind: EventMoved, Topic: "t", Count: 1}, e)
			case EventReserved:
				assert.GreaterOrEqual(t, e.Lateness, time.Duration(0), "never early")
			case EventHandled:
				assert.NoError(t, e.Err)
				assert.Positive(t, e.Duration)
			}
		}
	})
}

func TestEveryObserverReceivesEveryEvent(t *testing.T) {
	first, second, third := &recorder{}, &recorder{}, &recorder{}
	q := newQueue(t, miniredisClient(t), WithObserver(first), WithObserver(nil), WithObserver(second), WithObserver(third))
	pushed(t, q, &Job{ID: "j", Topic: "t"})
	want := []Event{{Kind: EventPushed, Topic: "t", JobID: "j"}}
	assert.Equal(t, want, first.all())
	assert.Equal(t, want, second.all())
	assert.Equal(t, want, third.all())
}
