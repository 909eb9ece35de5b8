package delayqueue

import (
	"fmt"
	"strconv"
	"strings"
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

// ParseState reads a state's name as String writes it: "delayed", "ready",
// "reserved" or "dead". Any other name is ErrInvalidState.
func ParseState(name string) (State, error) {
	for s := StateDelayed; s <= StateDead; s++ {
		if s.String() == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w %q: want delayed, ready, reserved or dead", ErrInvalidState, name)
}

// Job is a unit of work: a body for a topic, due at a time.
//
// Set ID (optional), Topic, Body, Delay or RunAt, and optionally TTR,
// MaxAttempts and Headers when pushing. Attempts, State and ReservedUntil
// are read-only: they are filled in by Pop and Get and ignored by Push.
type Job struct {
	// ID identifies the job. Empty on Push: an ID is generated, unique
	// among all processes that ever opened the queue ("~" and base 58, from
	// 4 characters: this instance's number from a counter in Redis, and a
	// count; short to keep memory low). A caller-chosen ID makes Push
	// idempotent: while a job with that ID exists (and for its dedup
	// window after), pushing it again creates nothing. A caller's ID may
	// not begin with "~"; the Job that Push gave a generated ID may be
	// pushed again, and is the same job.
	ID string
	// Topic names the kind of work; consumers pop by topic.
	Topic string
	// Body is opaque to the queue.
	Body []byte
	// Headers are small key/value pairs that travel with the job from Push
	// to whoever pops it, such as a W3C trace context; retries, moves and
	// requeues keep them, Upsert replaces them. Opaque to the queue: at most
	// 64, keys not empty, keys and values adding up to at most 60 KiB with
	// what push middleware adds (ErrInvalidJob otherwise). A job without
	// headers comes back with nil.
	Headers map[string]string
	// Delay is how long after Push the job is due, measured on the Redis
	// server's clock. Zero means now.
	Delay time.Duration
	// RunAt is an absolute due time, an alternative to Delay; Push refuses
	// a job with both. It carries the caller's clock. A RunAt in the past
	// makes the job ready at once, as a zero Delay does. On a job returned
	// by Get it is the due time of a delayed or ready job (on a dead job it
	// repeats DiedAt).
	RunAt time.Time
	// TTR (time to run) is how long a consumer may hold the job after Pop
	// before it is delivered again. Zero means the queue's default; at most
	// 2^32-1 ms (49 days).
	TTR time.Duration
	// MaxAttempts is how many deliveries the job gets before it goes to the
	// dead letters. Zero means the queue's default; at most 65,535.
	MaxAttempts int
	// DedupWindow keeps the job's ID taken for this long after the job is
	// finished or removed: a push of the same ID within the window creates
	// nothing, so that a producer's retried push cannot bring back a job
	// already done or cancelled. Zero means the queue's default
	// (WithDedupWindow); at most 2^32-1 ms (49 days).
	DedupWindow time.Duration
	// Attempts counts the job's deliveries so far, this one included.
	Attempts int
	// State is where the job is.
	State State
	// ReservedUntil is when the reservation of a reserved job runs out, on
	// the Redis server's clock, as of Pop, Get or Touch. Consume extends
	// the reservations of the jobs it runs without changing this field.
	ReservedUntil time.Time
	// LastError is why the job's last delivery failed: the error given to
	// Retry, or that its reservation ran out. Empty when none failed.
	LastError string
	// DiedAt is when a dead job went to the dead letters, on the Redis
	// server's clock; zero for a job in any other state.
	DiedAt time.Time

	// dueAt is when a popped job was due, on the server's clock (zero when
	// not known): its lateness is the start of its reservation less this.
	dueAt time.Time
	// reservation identifies the reservation a popped job was delivered under;
	// Retry, Touch and Release check it inside their scripts. Zero on a job
	// that Pop did not return.
	reservation int64
	// grant is the capacity grant of a popped job of a limited topic
	// (limits_grants.go), given back when the job is settled.
	grant string
	// queue is the identity of the queue whose Pop returned the job: its
	// reservation is a number of that queue's alone.
	queue string
	// nonce marks the pushes of a job whose ID the queue generated (see
	// push.lua); kept here so that pushing the same Job again is known for
	// what it is.
	nonce uint32
	// madeBy is the identity of the queue that generated the job's ID,
	// when one did: another queue makes IDs of the same form.
	madeBy string
}

// generatedMark begins every ID the queue generates, and no ID of a
// caller's: the two can never meet.
const generatedMark = "~"

// generated reports whether the queue made id.
func generated(id string) bool { return strings.HasPrefix(id, generatedMark) }

const (
	maxTopicLen = 200
	maxIDLen    = 200
	// The grammars, as errors and docs state them.
	topicGrammar = "a topic is 1 to 200 bytes of printable UTF-8 with no spaces, '{' or '}'"
	idGrammar    = "an ID is 1 to 200 bytes with no control characters, and only the queue's own begin with '~'"
)

// validateTopic accepts 1 to 200 bytes of printable UTF-8 without spaces,
// braces or control characters, so that a topic can never change a key's
// hash tag or the job encoding.
func validateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: empty; %s", ErrInvalidTopic, topicGrammar)
	case len(topic) > maxTopicLen:
		return fmt.Errorf("%w: %d bytes; %s", ErrInvalidTopic, len(topic), topicGrammar)
	case !utf8.ValidString(topic):
		return fmt.Errorf("%w: %q is not UTF-8; %s", ErrInvalidTopic, topic, topicGrammar)
	}
	for _, r := range topic {
		if r == '{' || r == '}' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q holds %q; %s", ErrInvalidTopic, topic, r, topicGrammar)
		}
	}
	return nil
}

const (
	maxHeaders     = 64
	maxHeadersSize = 60 << 10 // keys and values, added up
)

// validateHeaders accepts up to 64 headers with non-empty keys, whose keys
// and values add up to at most 60 KiB: encoded, they fit the 2-byte length
// the encoding gives them. It returns errors matching ErrInvalidJob.
func validateHeaders(h map[string]string) error {
	if len(h) > maxHeaders {
		return fmt.Errorf("%w: %d headers, limit %d", ErrInvalidJob, len(h), maxHeaders)
	}
	size := 0
	for k, v := range h {
		if k == "" {
			return fmt.Errorf("%w: a header with an empty key", ErrInvalidJob)
		}
		size += len(k) + len(v)
	}
	if size > maxHeadersSize {
		return fmt.Errorf("%w: headers of %d bytes, limit %d", ErrInvalidJob, size, maxHeadersSize)
	}
	return nil
}

// validateID accepts 1 to 200 bytes with no control characters.
func validateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty; %s", ErrInvalidID, idGrammar)
	case len(id) > maxIDLen:
		return fmt.Errorf("%w: %d bytes; %s", ErrInvalidID, len(id), idGrammar)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %q holds a control character; %s", ErrInvalidID, id, idGrammar)
		}
	}
	return nil
}

// maxRunAt is the latest due time a job can hold: at_ms is 6 bytes.
var maxRunAt = time.UnixMilli(1<<48 - 1)

// runAtMs is an absolute due time in Unix milliseconds, rounded up; a time
// before 1970 is due now all the same (its Unix milliseconds are not even
// defined 292 million years out). It returns an error matching
// ErrInvalidJob after maxRunAt (2^48-1 ms: August 10889).
func runAtMs(t time.Time) (int64, error) {
	switch {
	case t.After(maxRunAt):
		return 0, fmt.Errorf("%w: RunAt %v after %v", ErrInvalidJob, t, maxRunAt)
	case !t.After(unixEpoch):
		return 0, nil
	}
	return unixMsUp(t), nil
}

var unixEpoch = time.Unix(0, 0)

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
// It cannot overflow: the largest Duration is 9.2e12 ms, which the scripts
// add to the server's clock exactly (below 2^53) and which, added to any
// time before the year 2262, stays below the 2^48 ms that at_ms holds.
func ceilMs(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

// checkTopic checks a topic given by the caller of a dead-letter method.
func (q *DelayQueue) checkTopic(topic string) error {
	if q.closed.Load() {
		return ErrClosed
	}
	return validateTopic(topic)
}
