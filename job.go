package delayqueue

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// State is where a job is in its life. A job that was finished or removed has
// no state: it is gone.
type State int

// The states of a job.
const (
	// StateDelayed: pushed, waiting for its due time (or for its retry).
	StateDelayed State = 1
	// StateReady: due, waiting in its topic's ready list for a consumer.
	StateReady State = 2
	// StateReserved: popped by a consumer, which has TTR to finish it.
	StateReserved State = 3
	// StateDead: its attempts ran out; kept in its topic's dead letters.
	StateDead State = 4
)

func (s State) String() string {
	switch s {
	case StateDelayed:
		return "delayed"
	case StateReady:
		return "ready"
	case StateReserved:
		return "reserved"
	case StateDead:
		return "dead"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Job is a unit of work: a body for a topic, due at a time.
//
// Set ID (optional), Topic, Body, Delay or RunAt, and optionally TTR and
// MaxAttempts when pushing. Attempts, State and ReservedUntil are read-only:
// they are filled in by Pop and Get and ignored by Push.
type Job struct {
	// ID identifies the job. Empty on Push: a unique ID is generated. A
	// caller-chosen ID makes Push idempotent: while a job with that ID
	// exists, pushing it again creates nothing.
	ID string
	// Topic names the kind of work; consumers pop by topic.
	Topic string
	// Body is opaque to the queue.
	Body []byte
	// Delay is how long after Push the job is due, measured on the Redis
	// server's clock. Zero means now.
	Delay time.Duration
	// RunAt is an absolute due time, an alternative to Delay. It carries the
	// caller's clock. On a job returned by Get it is the due time of a
	// delayed job, or when a ready or dead job became so.
	RunAt time.Time
	// TTR (time to run) is how long a consumer may hold the job after Pop
	// before it is delivered again. Zero means the queue's default.
	TTR time.Duration
	// MaxAttempts is how many deliveries the job gets before it goes to the
	// dead letters. Zero means the queue's default.
	MaxAttempts int
	// Attempts counts the job's deliveries so far, this one included.
	Attempts int
	// State is where the job is.
	State State
	// ReservedUntil is when the reservation of a reserved job runs out, on
	// the Redis server's clock.
	ReservedUntil time.Time
	// LastError is why the job's last delivery failed: the error given to
	// Retry, or that its reservation ran out. Empty when none failed.
	LastError string

	// lease identifies the reservation a popped job was delivered under;
	// Retry, Touch and Release check it inside their scripts.
	lease int64
}

const (
	maxTopicLen = 200
	maxIDLen    = 200
)

// validateTopic accepts 1 to 200 bytes of printable UTF-8 without spaces,
// braces or control characters, so that a topic can never change a key's
// hash tag or the job encoding.
func validateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: empty", ErrInvalidTopic)
	case len(topic) > maxTopicLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidTopic, len(topic), maxTopicLen)
	case !utf8.ValidString(topic):
		return fmt.Errorf("%w: %q is not UTF-8", ErrInvalidTopic, topic)
	}
	for _, r := range topic {
		if r == '{' || r == '}' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q holds %q", ErrInvalidTopic, topic, r)
		}
	}
	return nil
}

// validateID accepts 1 to 200 bytes with no control characters.
func validateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidID)
	case len(id) > maxIDLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidID, len(id), maxIDLen)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %q holds a control character", ErrInvalidID, id)
		}
	}
	return nil
}

// pushArgs are the validated values of one job for push.lua.
type pushArgs struct {
	id, topic   string
	delayMs     int64 // -1 when runAtMs is the due time
	runAtMs     int64
	ttrMs       int64
	maxAttempts int
	body        []byte
}

// prepare checks a job against the queue's limits and fills in defaults. It
// returns errors matching ErrInvalidJob.
func (o *options) prepare(job *Job) (pushArgs, error) {
	if job == nil {
		return pushArgs{}, fmt.Errorf("%w: nil", ErrInvalidJob)
	}
	if err := validateTopic(job.Topic); err != nil {
		return pushArgs{}, fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	if job.ID != "" {
		if err := validateID(job.ID); err != nil {
			return pushArgs{}, fmt.Errorf("%w: %w", ErrInvalidJob, err)
		}
	}
	a := pushArgs{id: job.ID, topic: job.Topic, body: job.Body, delayMs: -1}
	switch {
	case len(job.Body) > o.maxBody:
		return a, fmt.Errorf("%w: %w: %d bytes, limit %d", ErrInvalidJob, ErrBodyTooLarge, len(job.Body), o.maxBody)
	case job.Delay < 0:
		return a, fmt.Errorf("%w: negative delay %v", ErrInvalidJob, job.Delay)
	case job.Delay > 0 && !job.RunAt.IsZero():
		return a, fmt.Errorf("%w: both Delay and RunAt set", ErrInvalidJob)
	case job.TTR < 0:
		return a, fmt.Errorf("%w: negative TTR %v", ErrInvalidJob, job.TTR)
	case job.TTR > 0 && job.TTR < time.Millisecond:
		return a, fmt.Errorf("%w: TTR %v under 1ms", ErrInvalidJob, job.TTR)
	case job.MaxAttempts < 0:
		return a, fmt.Errorf("%w: negative MaxAttempts %d", ErrInvalidJob, job.MaxAttempts)
	}
	if job.RunAt.IsZero() {
		a.delayMs = ceilMs(job.Delay)
	} else {
		a.runAtMs = unixMsUp(job.RunAt)
	}
	ttr := job.TTR
	if ttr == 0 {
		ttr = o.ttr
	}
	a.ttrMs = ceilMs(ttr)
	a.maxAttempts = job.MaxAttempts
	if a.maxAttempts == 0 {
		a.maxAttempts = o.maxAttempts
	}
	return a, nil
}

// unixMsUp is t in Unix milliseconds, rounded up so that a job is never due
// early.
func unixMsUp(t time.Time) int64 {
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}

// ceilMs rounds up to whole milliseconds, so that a job is never due early.
func ceilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// bucketOf maps a job ID to its bucket. It depends on the ID alone, so every
// process finds a job without a lookup; it must never change.
func bucketOf(id string, buckets int) int {
	return int(crc32.ChecksumIEEE([]byte(id)) % uint32(buckets))
}

// decodeJob reads a job as job.lua encodes it: nine header fields and the
// body, joined by '\n'.
func decodeJob(id string, v []byte) (*Job, error) {
	var f [9][]byte
	rest := v
	for i := range f {
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			return nil, fmt.Errorf("delayqueue: job %q: corrupt encoding", id)
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	if string(f[0]) != "1" {
		return nil, fmt.Errorf("delayqueue: job %q: unknown encoding version %q", id, f[0])
	}
	var n [6]int64
	for i := range n {
		x, err := strconv.ParseInt(string(f[i+1]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("delayqueue: job %q: corrupt field %d: %w", id, i+1, err)
		}
		n[i] = x
	}
	job := &Job{
		ID:          id,
		Topic:       string(f[7]),
		Body:        rest,
		State:       State(n[0]),
		Attempts:    int(n[1]),
		MaxAttempts: int(n[2]),
		TTR:         time.Duration(n[3]) * time.Millisecond,
		LastError:   string(f[8]),
		lease:       n[5],
	}
	at := time.UnixMilli(n[4])
	if job.State == StateReserved {
		job.ReservedUntil = at
	} else {
		job.RunAt = at
	}
	return job, nil
}
