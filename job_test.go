package delayqueue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPushRejectsBadJobsAndWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		q := newQueue(t, be.client, WithMaxBodySize(16))
		before := keysOf(t, be.client)
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
			{"run-at after the year 10889", &Job{Topic: "t", RunAt: maxRunAt.Add(time.Millisecond)}, []error{ErrInvalidJob}},
			{"body over the limit", &Job{Topic: "t", Body: make([]byte, 17)}, []error{ErrInvalidJob, ErrBodyTooLarge}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				id, err := q.Push(context.Background(), tc.job)
				for _, want := range tc.errs {
					assert.ErrorIs(t, err, want)
				}
				assert.Empty(t, id)
			})
		}
		assert.Equal(t, before, keysOf(t, be.client), "a refused push must write nothing")
	})
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
	good := encodeJob("t", []byte("body"), 10, 3, 5)
	for _, v := range [][]byte{
		nil,
		good[:jobHeaderLen-1],
		append([]byte{2<<4 | 1}, good[1:]...), // unknown format
		append([]byte{jobFormat | 7}, good[1:]...),                           // unknown state
		append([]byte{jobFormat | 1 | jobHasError}, good[1:jobHeaderLen]...), // no error length
		append(append([]byte{}, good[:21]...), 200),                          // topic longer than the value
	} {
		_, err := decodeJob("id", v)
		assert.Error(t, err, "value %q", v)
	}
}

func TestDecodeJobReadsEveryField(t *testing.T) {
	v := []byte{jobFormat | byte(StateReserved) | jobHasError, 0, 2, 0, 5, 0, 0, 0x05, 0xdc}
	v = append(v, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00) // at 1700000000000
	v = append(v, 0, 0, 0, 0, 0, 4, 5)                // lease 4, topic length 5
	v = append(v, 0, 4)                               // error length 4
	v = append(v, "topicboombo\ndy"...)
	job, err := decodeJob("id", v)
	require.NoError(t, err)
	assert.Equal(t, &Job{
		ID: "id", Topic: "topic", Body: []byte("bo\ndy"), State: StateReserved, Attempts: 2, MaxAttempts: 5,
		TTR: 1500 * time.Millisecond, ReservedUntil: time.UnixMilli(1700000000000), LastError: "boom", lease: 4,
	}, job)
}

func TestEncodeJobRoundTrips(t *testing.T) {
	job, err := decodeJob("x", encodeJob("orders", []byte{0, '\n', 255}, 1<<32-1, 65535, 1<<48-1))
	require.NoError(t, err)
	assert.Equal(t, &Job{
		ID: "x", Topic: "orders", Body: []byte{0, '\n', 255}, State: StateDelayed, MaxAttempts: 65535,
		TTR: maxTTR, RunAt: maxRunAt,
	}, job)
}

func TestBucketOfIsStable(t *testing.T) {
	// Changing the mapping would strand every job already in Redis.
	assert.Equal(t, 0, bucketOf("42", 8))
	assert.Equal(t, 7, bucketOf("order-1", 8))
	assert.Equal(t, 0, bucketOf("anything", 1))
}
