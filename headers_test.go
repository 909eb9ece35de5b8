package delayqueue

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manyHeaders makes n headers.
func manyHeaders(n int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[fmt.Sprintf("k%d", i)] = "v"
	}
	return h
}

// withHeaders adds raw, as the headers field, to v: a job encoded with no
// optional field and no last error.
func withHeaders(v, raw []byte) []byte {
	out := append([]byte{v[0] | jobHasHeaders}, v[1:jobHeaderLen]...)
	out = binary.BigEndian.AppendUint16(out, uint16(len(raw)))
	topicEnd := jobHeaderLen + int(v[21])
	out = append(out, v[jobHeaderLen:topicEnd]...)
	out = append(out, raw...)
	return append(out, v[topicEnd:]...)
}

// traceHeaders are what a W3C trace context propagator writes.
var traceHeaders = map[string]string{
	"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	"tracestate":  "congo=t61rcWkgMzE",
	"empty":       "",
}

func TestAJobWithoutHeadersIsEncodedAsBeforeHeadersExisted(t *testing.T) {
	// The bytes of this job as the encoding wrote it before headers
	// existed: a delayed job, no attempts, 3 max, TTR 1,500 ms, at_ms 5,
	// no reservation, topic "t", body "body".
	before := []byte{jobFormat | byte(StateDelayed), 0, 0, 0, 3, 0, 0, 0x05, 0xdc, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 1}
	before = append(before, "tbody"...)
	o := defaultOptions()
	for _, h := range []map[string]string{nil, {}} {
		a, err := o.prepare(&Job{ID: "x", Topic: "t", Body: []byte("body"), TTR: 1500 * time.Millisecond,
			MaxAttempts: 3, RunAt: time.UnixMilli(5), Headers: h})
		require.NoError(t, err)
		assert.Equal(t, before, a.job, "headers %#v cost no byte", h)
	}
	a, err := o.prepare(&Job{ID: "x", Topic: "t", Body: []byte("body"), TTR: 1500 * time.Millisecond,
		MaxAttempts: 3, RunAt: time.UnixMilli(5), Headers: map[string]string{"k": "v"}})
	require.NoError(t, err)
	assert.Equal(t, withHeaders(before, []byte{1, 'k', 1, 'v'}), a.job, "headers: a flag, their length, their bytes")
}

func TestAJobWithoutHeadersIsStoredAsBeforeHeadersExisted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		stored := func(id string) []byte {
			bk := q.keys.bucket(bucketOf(id, q.opts.buckets))
			v, err := be.client.HGet(ctx, bk.pool, id).Bytes()
			require.NoError(t, err)
			return v
		}
		plain := pushed(t, q, &Job{ID: "plain", Topic: "t", Body: []byte("body"), Delay: time.Hour})
		assert.Equal(t, encodeJob("t", []byte("body"), 30000, 10, 0, 0, 0, nil), stored(plain))
		assert.Len(t, stored(plain), jobHeaderLen+len("t")+len("body"))

		// Ready at once: push.lua writes a new header on the same rest.
		ready := pushed(t, q, &Job{ID: "ready", Topic: "t", Body: []byte("body"), Headers: map[string]string{}})
		assert.Len(t, stored(ready), jobHeaderLen+len("t")+len("body"))
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		assert.Nil(t, job.Headers)

		traced := pushed(t, q, &Job{ID: "traced", Topic: "t", Body: []byte("body"), Delay: time.Hour, Headers: traceHeaders})
		assert.Len(t, stored(traced), jobHeaderLen+2+len(encodeHeaders(traceHeaders))+len("t")+len("body"))
	})
}

func TestEncodeJobRoundTripsHeaders(t *testing.T) {
	h := manyHeaders(maxHeaders)
	size := 0
	for k, v := range h {
		size += len(k) + len(v)
	}
	h["k0"] = strings.Repeat("v", maxHeadersSize-size+1) // up to the limit
	require.NoError(t, validateHeaders(h))
	raw := encodeHeaders(h)
	assert.LessOrEqual(t, len(raw), 1<<16-1, "the largest headers fit their 2-byte length")
	job, err := decodeJob("x", encodeJob("t", []byte("b"), 5, 1, 0, 1, 1, raw))
	require.NoError(t, err)
	assert.Equal(t, h, job.Headers)
	assert.Equal(t, "t", job.Topic)
	assert.Equal(t, []byte("b"), job.Body)
	assert.Equal(t, uint32(1), job.nonce)
	assert.Equal(t, time.Millisecond, job.DedupWindow)
	assert.Equal(t, raw, encodeHeaders(job.Headers), "equal headers encode alike")
}

// TestHeadersTravelWithTheJobThroughEveryScript takes a job with headers
// through every script that decodes and encodes it, and checks at each
// step that its headers, and its other fields, come out as they went in.
func TestHeadersTravelWithTheJobThroughEveryScript(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client, WithBackoff(BackoffSchedule(0)))
		body := []byte("body\x00\xff")
		check := func(job *Job, err error, headers map[string]string, step string) *Job {
			t.Helper()
			require.NoError(t, err, step)
			assert.Equal(t, headers, job.Headers, step)
			assert.Equal(t, "t", job.Topic, step)
			assert.Equal(t, body, job.Body, step)
			return job
		}
		get := func(id string, want State, headers map[string]string, step string) *Job {
			t.Helper()
			job, err := q.Get(ctx, id)
			job = check(job, err, headers, step)
			assert.Equal(t, want, job.State, step)
			return job
		}
		pop := func(headers map[string]string, step string) *Job {
			t.Helper()
			job, err := q.Pop(ctx, "t", 0)
			return check(job, err, headers, step)
		}
		// moveDue waits until the job's reservation ran out and the bucket
		// handler's script moved it.
		moveDue := func(id string) {
			t.Helper()
			b := bucketOf(id, q.opts.buckets)
			require.Eventually(t, func() bool {
				r, err := q.moveDue(ctx, b, "token", false)
				require.NoError(t, err)
				return r.moved > 0
			}, 10*time.Second, time.Millisecond)
		}

		id := pushed(t, q, &Job{ID: "j", Topic: "t", Body: body, Delay: time.Hour, Headers: traceHeaders})
		get(id, StateDelayed, traceHeaders, "pushed")
		require.NoError(t, q.RescheduleIn(ctx, id, 0))
		get(id, StateReady, traceHeaders, "rescheduled to now")
		job := pop(traceHeaders, "reserved")
		require.NoError(t, q.Touch(ctx, job))
		get(id, StateReserved, traceHeaders, "touched")
		require.NoError(t, q.Release(ctx, job))
		get(id, StateReady, traceHeaders, "released")
		job = pop(traceHeaders, "reserved again")
		require.NoError(t, q.Retry(ctx, job, errors.New("boom")))
		job = get(id, StateReady, traceHeaders, "retried")
		assert.Equal(t, "boom", job.LastError, "the last error beside the headers")
		require.NoError(t, q.RescheduleIn(ctx, id, time.Hour))
		get(id, StateDelayed, traceHeaders, "rescheduled later")

		// Upsert replaces the headers; a TTR of 1ms lets reservations run
		// out for the bucket handler's script.
		other := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		_, err := q.Upsert(ctx, &Job{ID: id, Topic: "t", Body: body, TTR: time.Millisecond, MaxAttempts: 2, Headers: other})
		require.NoError(t, err)
		pop(other, "upserted, reserved")
		moveDue(id)
		get(id, StateReady, other, "reservation ran out")
		pop(other, "reserved a last time")
		moveDue(id)
		dead, err := listJobs(ctx, q, "t", StateDead, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		check(dead[0], nil, other, "dead")
		assert.Contains(t, dead[0].LastError, "reservation ran out")
		require.NoError(t, q.RequeueDead(ctx, id))
		pop(other, "requeued, reserved")
		require.NoError(t, q.Finish(ctx, id))

		ids, err := q.PushMany(ctx, []*Job{
			{Topic: "t", Body: body, Headers: traceHeaders},
			{Topic: "t", Body: body},
		})
		require.NoError(t, err)
		get(ids[0].ID, StateReady, traceHeaders, "pushed with PushMany")
		get(ids[1].ID, StateReady, nil, "pushed with PushMany, without headers")
	})
}
