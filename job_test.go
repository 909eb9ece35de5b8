package delayqueue

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPushRejectsBadJobsAndWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		q := newQueue(t, be.client, WithMaxBodySize(16))
		before := keysOfQueues(t, be.client, q.opts.name)
		for _, tc := range []struct {
			name string
			job  *Job
			errs []error
		}{
			{"nil job", nil, []error{ErrInvalidJob}},
			{"empty topic", &Job{}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"topic with brace", &Job{Topic: "a{b"}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"topic with closing brace", &Job{Topic: "a}b"}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"topic with space", &Job{Topic: "a b"}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"topic with newline", &Job{Topic: "a\nb"}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"topic too long", &Job{Topic: strings.Repeat("t", maxTopicLen+1)}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"topic not UTF-8", &Job{Topic: "\xff"}, []error{ErrInvalidJob, ErrInvalidTopic}},
			{"id with newline", &Job{Topic: "t", ID: "a\nb"}, []error{ErrInvalidJob, ErrInvalidID}},
			{"id too long", &Job{Topic: "t", ID: strings.Repeat("i", maxIDLen+1)}, []error{ErrInvalidJob, ErrInvalidID}},
			{"negative delay", &Job{Topic: "t", Delay: -time.Second}, []error{ErrInvalidJob}},
			{"delay and run-at", &Job{Topic: "t", Delay: time.Second, RunAt: time.Now()}, []error{ErrInvalidJob}},
			{"negative TTR", &Job{Topic: "t", TTR: -time.Second}, []error{ErrInvalidJob}},
			{"TTR under 1ms", &Job{Topic: "t", TTR: time.Microsecond}, []error{ErrInvalidJob}},
			{"negative max attempts", &Job{Topic: "t", MaxAttempts: -1}, []error{ErrInvalidJob}},
			{"max attempts over 65535", &Job{Topic: "t", MaxAttempts: 65536}, []error{ErrInvalidJob}},
			{"TTR over 49 days", &Job{Topic: "t", TTR: maxTTR + time.Millisecond}, []error{ErrInvalidJob}},
			{"negative dedup window", &Job{Topic: "t", DedupWindow: -time.Second}, []error{ErrInvalidJob}},
			{"dedup window over 49 days", &Job{Topic: "t", DedupWindow: maxDedupWindow + time.Millisecond}, []error{ErrInvalidJob}},
			{"run-at after the year 10889", &Job{Topic: "t", RunAt: maxRunAt.Add(time.Millisecond)}, []error{ErrInvalidJob}},
			{"body over the limit", &Job{Topic: "t", Body: make([]byte, 17)}, []error{ErrInvalidJob, ErrBodyTooLarge}},
			{"too many headers", &Job{Topic: "t", Headers: manyHeaders(maxHeaders + 1)}, []error{ErrInvalidJob}},
			{"a header with an empty key", &Job{Topic: "t", Headers: map[string]string{"": "v"}}, []error{ErrInvalidJob}},
			{"headers over 60 KiB", &Job{Topic: "t", Headers: map[string]string{"k": strings.Repeat("v", maxHeadersSize)}}, []error{ErrInvalidJob}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				id, err := q.Push(context.Background(), tc.job)
				for _, want := range tc.errs {
					assert.ErrorIs(t, err, want)
				}
				assert.Empty(t, id)
				require.Error(t, err)
				assert.Equal(t, 1, strings.Count(err.Error(), "delayqueue:"), "one prefix: %v", err)
				assert.True(t, strings.HasPrefix(err.Error(), "delayqueue: invalid job"), err.Error())
			})
		}
		assert.Equal(t, before, keysOfQueues(t, be.client, q.opts.name), "a refused push must write nothing")
	})
}

func TestInvalidTopicsAndIDsSayTheGrammar(t *testing.T) {
	q := newQueue(t, miniredisClient(t))
	_, err := q.Push(context.Background(), &Job{Topic: "bad topic!"})
	assert.EqualError(t, err, `delayqueue: invalid job: invalid topic: "bad topic!" holds ' '; `+topicGrammar)
	_, err = q.Push(context.Background(), &Job{Topic: "t", ID: "a\x00b"})
	assert.EqualError(t, err, `delayqueue: invalid job: invalid job id: "a\x00b" holds a control character; `+idGrammar)
	_, err = q.Pop(context.Background(), "", 0)
	assert.EqualError(t, err, "delayqueue: invalid topic: empty; "+topicGrammar)
}

func TestPushAcceptsUnicodeTopicsAndBinaryBodies(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		q := newQueue(t, be.client)
		body := []byte("line one\nline two\x00\xff and more\n")
		id := pushed(t, q, &Job{Topic: "commandes:annulées*", Body: body, Delay: time.Hour})
		got, err := q.Get(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, "commandes:annulées*", got.Topic)
		assert.Equal(t, body, got.Body)
		assert.Equal(t, StateDelayed, got.State)
	})
}

func TestDecodeJobRejectsCorruptValues(t *testing.T) {
	good := encodeJob("t", []byte("body"), 10, 3, 5, 0, 0, nil)
	for _, v := range [][]byte{
		nil,
		good[:jobHeaderLen-1],
		append([]byte{2<<4 | 1}, good[1:]...), // unknown format
		append([]byte{jobFormat | 7}, good[1:]...),                               // unknown state
		append([]byte{jobFormat | 1 | jobHasError}, good[1:jobHeaderLen]...),     // no error length
		append(append([]byte{}, good[:21]...), 200),                              // topic longer than the value
		append([]byte{jobFormat | 1 | jobHasWindow}, good[1:jobHeaderLen+2]...),  // short window
		append([]byte{jobFormat | 1 | jobHasHeaders}, good[1:jobHeaderLen+1]...), // short headers length
		withHeaders(good, []byte{3, 'k'}),                                        // a key longer than the headers
		withHeaders(good, []byte{1, 'k'}),                                        // a key without a value
	} {
		_, err := decodeJob("id", v)
		assert.Error(t, err, "value %q", v)
	}
}

func TestDecodeJobReadsEveryField(t *testing.T) {
	v := []byte{jobFormat | byte(StateReserved) | jobHasError, 0, 2, 0, 5, 0, 0, 0x05, 0xdc}
	v = append(v, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00) // at 1700000000000
	v = append(v, 0, 0, 0, 0, 0, 4, 5)                // reservation 4, topic length 5
	v = append(v, 0, 4)                               // error length 4
	v = append(v, "topicboombo\ndy"...)
	job, err := decodeJob("id", v)
	require.NoError(t, err)
	assert.Equal(t, &Job{
		ID: "id", Topic: "topic", Body: []byte("bo\ndy"), State: StateReserved, Attempts: 2, MaxAttempts: 5,
		TTR: 1500 * time.Millisecond, ReservedUntil: time.UnixMilli(1700000000000), LastError: "boom", reservation: 4,
	}, job)
}

func TestEncodeJobRoundTrips(t *testing.T) {
	job, err := decodeJob("x", encodeJob("orders", []byte{0, '\n', 255}, 1<<32-1, 65535, 1<<48-1, 0, 0, nil))
	require.NoError(t, err)
	assert.Equal(t, &Job{
		ID: "x", Topic: "orders", Body: []byte{0, '\n', 255}, State: StateDelayed, MaxAttempts: 65535,
		TTR: maxTTR, RunAt: maxRunAt,
	}, job)
}

func TestEncodeJobKeepsTheDedupWindow(t *testing.T) {
	job, err := decodeJob("x", encodeJob("t", []byte("b"), 5, 1, 0, 1<<32-1, 1<<32-1, nil))
	require.NoError(t, err)
	assert.Equal(t, maxDedupWindow, job.DedupWindow)
	assert.Equal(t, uint32(1<<32-1), job.nonce)
	assert.Equal(t, "t", job.Topic)
	assert.Equal(t, []byte("b"), job.Body)
}

func TestBucketOfIsStable(t *testing.T) {
	// Changing the mapping would strand every job already in Redis.
	assert.Equal(t, 0, bucketOf("42", 8))
	assert.Equal(t, 7, bucketOf("order-1", 8))
	assert.Equal(t, 0, bucketOf("anything", 1))
}

// FuzzDueTimesAreNeverEarly pushes, retries and reschedules with any
// duration and time, on a server clock held still, and checks that each
// call is refused with ErrInvalidJob or makes the job due no earlier than
// asked: no input wraps around into "due now".
func FuzzDueTimesAreNeverEarly(f *testing.F) {
	for _, d := range []int64{0, 1, 999_999, 1_000_001, math.MaxInt64, math.MaxInt64 - 1, math.MinInt64, -1} {
		for op := range uint8(5) {
			f.Add(op, d, int64(0), int64(0))
		}
	}
	for _, sec := range []int64{0, -1, 253402300799 /* 9999-12-31 */, maxRunAt.Unix(), maxRunAt.Unix() + 1, math.MaxInt64, math.MinInt64} {
		f.Add(uint8(1), int64(0), sec, int64(999_999_999))
		f.Add(uint8(4), int64(0), sec, int64(1))
	}
	m := miniredis.NewMiniRedis()
	require.NoError(f, m.Start())
	f.Cleanup(m.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	f.Cleanup(func() { _ = c.Close() })
	now := time.UnixMilli(1_700_000_000_000)

	f.Fuzz(func(t *testing.T, op uint8, d int64, sec, nsec int64) {
		ctx := context.Background()
		m.FlushAll()
		m.SetTime(now)
		q, err := New(c, WithBuckets(1), WithLogger(discard))
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close(ctx)) }()
		delay, runAt := time.Duration(d), time.Unix(sec, nsec)
		// asked is the earliest the job may be due; refused reports whether
		// the input must be refused.
		var asked time.Time
		var refused bool
		var id string
		switch op % 5 {
		case 0: // Push with a delay
			asked, refused = now.Add(delay), delay < 0
			id, err = q.Push(ctx, &Job{Topic: "t", Delay: delay})
		case 1: // Push at a time
			asked, refused = runAt, runAt.After(maxRunAt)
			id, err = q.Push(ctx, &Job{Topic: "t", RunAt: runAt})
		case 2: // RetryAfter
			id = pushed(t, q, &Job{Topic: "t"})
			job, perr := q.Pop(ctx, "t", 0)
			require.NoError(t, perr)
			asked, refused = now.Add(delay), delay < 0
			err = q.RetryAfter(ctx, job, delay, errors.New("failed"))
		case 3: // Reschedule with a delay
			id = pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
			asked, refused = now.Add(delay), delay < 0
			err = q.RescheduleIn(ctx, id, delay)
		case 4: // Reschedule at a time
			id = pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
			asked, refused = runAt, runAt.IsZero() || runAt.After(maxRunAt)
			err = q.RescheduleAt(ctx, id, runAt)
		}
		if refused {
			require.ErrorIs(t, err, ErrInvalidJob)
			return
		}
		require.NoError(t, err)
		job, err := q.Get(ctx, id)
		require.NoError(t, err)
		switch job.State {
		case StateReady:
			assert.False(t, asked.After(now), "ready at once, though asked for %v", asked)
		case StateDelayed:
			assert.False(t, job.RunAt.Before(asked), "due at %v, asked for %v", job.RunAt, asked)
		default:
			t.Fatalf("state %v", job.State)
		}
	})
}

func FuzzExponentialBackoffStaysInRange(f *testing.F) {
	f.Add(int64(time.Second), int64(math.MaxInt64), 35)
	f.Add(int64(time.Second), int64(time.Hour), 65535)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), 2)
	f.Add(int64(-1), int64(time.Hour), 1)
	f.Fuzz(func(t *testing.T, base, limit int64, attempt int) {
		b, l := time.Duration(base), time.Duration(limit)
		d := ExponentialBackoff(b, l)(attempt)
		if b <= 0 || l <= 0 {
			assert.Zero(t, d)
			return
		}
		// The wait before jitter is base doubled attempt-1 times, capped at
		// limit; jitter keeps at least half of it.
		want := min(b, l)
		for i := 1; i < attempt && want < l; i++ {
			want = min(l, want*2)
			if want < 0 { // the doubling overflowed: the cap applies
				want = l
			}
		}
		assert.GreaterOrEqual(t, d, want/2)
		assert.LessOrEqual(t, d, want)
	})
}

func TestTheLargestDurationsStayInTheFuture(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		later := time.Now().Add(200 * 365 * 24 * time.Hour)
		delayed := func(id string) {
			t.Helper()
			job, err := q.Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, StateDelayed, job.State)
			assert.True(t, job.RunAt.After(later), "due at %v", job.RunAt)
		}
		delayed(pushed(t, q, &Job{Topic: "t", Delay: math.MaxInt64}))

		id := pushed(t, q, &Job{Topic: "t", Delay: time.Hour})
		require.NoError(t, q.RescheduleIn(ctx, id, math.MaxInt64))
		delayed(id)

		id = pushed(t, q, &Job{Topic: "u"})
		job, err := q.Pop(ctx, "u", 0)
		require.NoError(t, err)
		require.NoError(t, q.RetryAfter(ctx, job, math.MaxInt64, errors.New("later")))
		delayed(id)

		// The latest RunAt the encoding holds is kept exactly.
		id = pushed(t, q, &Job{Topic: "t", RunAt: maxRunAt})
		job, err = q.Get(ctx, id)
		require.NoError(t, err)
		assert.True(t, job.RunAt.Equal(maxRunAt), "due at %v", job.RunAt)
	})
}

func TestParseStateReadsWhatStringWrites(t *testing.T) {
	for s := StateDelayed; s <= StateDead; s++ {
		got, err := ParseState(s.String())
		require.NoError(t, err)
		assert.Equal(t, s, got)
	}
	for _, bad := range []string{"", "Ready", "sleeping", "State(5)"} {
		_, err := ParseState(bad)
		assert.ErrorIs(t, err, ErrInvalidState, "%q", bad)
	}
}
