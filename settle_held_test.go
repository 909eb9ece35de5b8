package delayqueue

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAStaleFinishCannotDeleteAnotherConsumersJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		a := newQueue(t, be.client, WithName(name))
		b := newQueue(t, be.client, WithName(name))
		startQueue(t, b)
		id := pushed(t, a, &Job{Topic: "t", TTR: 100 * time.Millisecond})
		stale, err := a.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		// a stalls; its reservation runs out and b gets the job.
		current, err := b.Pop(ctx, "t", time.Minute)
		require.NoError(t, err)
		require.Equal(t, stale.ID, current.ID)
		require.NoError(t, b.Touch(ctx, current))

		assert.ErrorIs(t, a.Finish(ctx, id), ErrReservationLost, "a's late Finish")
		assert.ErrorIs(t, a.Finish(ctx, id), ErrReservationLost, "and again")
		got, err := b.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, StateReserved, got.State, "b still holds the job")
		assert.Equal(t, 2, got.Attempts)
		require.NoError(t, b.Finish(ctx, id))
		_, err = b.Get(ctx, id)
		assert.ErrorIs(t, err, ErrNotFound)
	})
}

func TestFinishOfAJobPoppedElsewhereFinishesItsReservation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		popper, finisher := newQueue(t, be.client, WithName(name)), newQueue(t, be.client, WithName(name))
		id := pushed(t, popper, &Job{Topic: "t"})
		_, err := popper.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, finisher.Finish(ctx, id), "an ID handed over from the process that popped it")
		_, err = popper.Get(ctx, id)
		assert.ErrorIs(t, err, ErrNotFound)
	})
}

func TestHeldReservationsAreForgottenAfterTheirHorizon(t *testing.T) {
	var s heldSet
	old := time.Now().Add(-heldHorizon - time.Minute)
	s.add([]*Job{{ID: "old", TTR: time.Second, reservation: 1}, {ID: "recent", TTR: heldHorizon, reservation: 2}}, old)
	for i := range 1024 {
		s.add([]*Job{{ID: strconv.Itoa(i), TTR: time.Second, reservation: 3}}, time.Now())
	}
	r, _ := s.reservation("old")
	assert.Zero(t, r, "ran out more than an hour ago")
	r, _ = s.reservation("recent")
	assert.Equal(t, int64(2), r, "ran out less than an hour ago")
	s.settled("recent", 5)
	r, _ = s.reservation("recent")
	assert.Equal(t, int64(2), r, "another reservation's settling leaves it")
	s.settled("recent", 2)
	r, _ = s.reservation("recent")
	assert.Zero(t, r)
}

// TestFaultStaleConsumerProcessFinishesLate runs the stale consumer as a
// process of its own: it pops, is paused past the job's TTR while this
// process gets the job, and calls Finish when it resumes.
func TestFaultStaleConsumerProcessFinishesLate(t *testing.T) {
	s, name, q := startedQueue(t)
	id := pushed(t, q, &Job{Topic: "t", TTR: 200 * time.Millisecond})

	stale := startChild(t, "finish-late", s.Addr, name)
	stale.expect(t, "popped "+id)
	stale.signal(t, syscall.SIGSTOP)
	current, err := q.Pop(context.Background(), "t", time.Minute)
	require.NoError(t, err)
	require.Equal(t, id, current.ID)
	require.NoError(t, q.Touch(context.Background(), current))
	stale.signal(t, syscall.SIGCONT)
	stale.say(t, "finish")
	stale.expect(t, "finish: "+ErrReservationLost.Error())

	got, err := q.Get(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, StateReserved, got.State, "the job this process holds is still there")
	require.NoError(t, q.Finish(context.Background(), id))
	t.Logf("FAULT stale consumer process: its late Finish returned %v; the current holder finished the job", ErrReservationLost)
}

// finishLateHelper pops one job, says which, and finishes it when told to,
// saying what Finish returned.
func finishLateHelper(q *DelayQueue) int {
	job, err := q.Pop(context.Background(), "t", time.Minute)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("popped", job.ID)
	if !readLine("finish") {
		return 1
	}
	err = q.Finish(context.Background(), job.ID)
	fmt.Printf("finish: %v\n", err)
	return 0
}

func TestAJobFromGetCannotActOnAReservation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		id := pushed(t, q, &Job{Topic: "t"})
		_, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		got, err := q.Get(ctx, id)
		require.NoError(t, err)
		assert.ErrorIs(t, q.Retry(ctx, got, nil), ErrInvalidJob)
		assert.ErrorIs(t, q.Touch(ctx, got), ErrInvalidJob)
		assert.ErrorIs(t, q.Release(ctx, got), ErrInvalidJob)
		job, err := q.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, StateReserved, job.State, "the popper's reservation stands")
	})
}
