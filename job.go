package delayqueue

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
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

// Job is a unit of work: a body for a topic, due at a time.
//
// Set ID (optional), Topic, Body, Delay or RunAt, and optionally TTR and
// MaxAttempts when pushing. Attempts, State and ReservedUntil are read-only:
// they are filled in by Pop and Get and ignored by Push.
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
	// Delay is how long after Push the job is due, measured on the Redis
	// server's clock. Zero means now.
	Delay time.Duration
	// RunAt is an absolute due time, an alternative to Delay. It carries the
	// caller's clock. On a job returned by Get it is the due time of a
	// delayed job, or when a ready or dead job became so.
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

	// lease identifies the reservation a popped job was delivered under;
	// Retry, Touch and Release check it inside their scripts. Zero on a job
	// that Pop did not return.
	lease int64
	// nonce marks the pushes of a job whose ID the queue generated (see
	// job.lua); kept here so that pushing the same Job again is known for
	// what it is.
	nonce uint32
}

// generatedMark begins every ID the queue generates, and no ID of a
// caller's: the two can never meet.
const generatedMark = "~"

// generated reports whether the queue made id.
func generated(id string) bool { return strings.HasPrefix(id, generatedMark) }

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

// pushArgs are the validated values of one job for push.lua, and its
// outcome.
type pushArgs struct {
	id     string
	bucket int
	// delayMs is the delay on the server's clock, or "" when the encoded
	// job's at_ms holds an absolute due time.
	delayMs string
	// job is the job encoded as delayed (see encodeJob).
	job []byte
	// generated is set when the queue made the ID: it must not exist
	// already, unless as this very job (a push re-sent by go-redis).
	generated bool
	// status is push.lua's answer for the job.
	status int64
}

// push.lua's answer for a job.
const (
	pushCreated = 1  // stored under its ID
	pushExisted = 0  // a caller's ID that exists already: nothing changed
	pushTaken   = -1 // a generated ID held by another job: nothing changed
)

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
		if generated(job.ID) && job.nonce == 0 {
			return pushArgs{}, fmt.Errorf("%w: %w: %q: IDs that begin with %q are the queue's own; push the Job that Push gave it, or use an ID of your own",
				ErrInvalidJob, ErrInvalidID, job.ID, generatedMark)
		}
	}
	var a pushArgs
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
	case job.TTR > maxTTR:
		return a, fmt.Errorf("%w: TTR %v over %v", ErrInvalidJob, job.TTR, maxTTR)
	case job.MaxAttempts < 0 || job.MaxAttempts > maxMaxAttempts:
		return a, fmt.Errorf("%w: MaxAttempts %d: want 0 to %d", ErrInvalidJob, job.MaxAttempts, maxMaxAttempts)
	case job.DedupWindow < 0 || job.DedupWindow > maxDedupWindow:
		return a, fmt.Errorf("%w: DedupWindow %v: want 0 to %v", ErrInvalidJob, job.DedupWindow, maxDedupWindow)
	}
	var atMs int64
	if job.RunAt.IsZero() {
		a.delayMs = strconv.FormatInt(ceilMs(job.Delay), 10)
	} else {
		var err error
		if atMs, err = runAtMs(job.RunAt); err != nil {
			return a, err
		}
	}
	ttr := job.TTR
	if ttr == 0 {
		ttr = o.ttr
	}
	maxAttempts := job.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = o.maxAttempts
	}
	a.generated = job.ID == "" || generated(job.ID)
	window := job.DedupWindow
	if window == 0 && !a.generated {
		window = o.dedup // a generated ID is never pushed again by a producer
	}
	if a.generated && job.nonce == 0 {
		job.nonce = rand.Uint32() | 1
	}
	var nonce uint32
	if a.generated {
		nonce = job.nonce
	}
	a.id = job.ID
	a.job = encodeJob(job.Topic, job.Body, ceilMs(ttr), maxAttempts, atMs, ceilMs(window), nonce)
	return a, nil
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

// bucketOf maps a job ID to its bucket. It depends on the ID alone, so every
// process finds a job without a lookup; it must never change.
func bucketOf(id string, buckets int) int {
	return int(crc32.ChecksumIEEE([]byte(id)) % uint32(buckets))
}

// The job encoding; job.lua documents it and decodes it in scripts.
const (
	jobFormatVersion = 2
	jobFormat        = jobFormatVersion << 6 // in the top 2 bits of the first byte
	jobHasNonce      = 1 << 5
	jobHasWindow     = 1 << 4
	jobHasError      = 1 << 3
	jobHeaderLen     = 22

	maxTTR         = (1<<32 - 1) * time.Millisecond // ttr_ms is 4 bytes
	maxMaxAttempts = 1<<16 - 1                      // max attempts is 2 bytes
	maxDedupWindow = (1<<32 - 1) * time.Millisecond // the window is 4 bytes
)

// encodeJob writes a new delayed job as push.lua stores it: no attempts, no
// lease, no error, due at atMs (push.lua writes the due time of a delay),
// with a dedup window of windowMs and a push nonce (0: none of either).
func encodeJob(topic string, body []byte, ttrMs int64, maxAttempts int, atMs, windowMs int64, nonce uint32) []byte {
	n := jobHeaderLen
	if windowMs > 0 {
		n += 4
	}
	if nonce != 0 {
		n += 4
	}
	v := make([]byte, jobHeaderLen, n+len(topic)+len(body))
	v[0] = jobFormat | byte(StateDelayed)
	binary.BigEndian.PutUint16(v[3:], uint16(maxAttempts))
	binary.BigEndian.PutUint32(v[5:], uint32(ttrMs))
	putUint48(v[9:], uint64(atMs))
	v[21] = byte(len(topic))
	if windowMs > 0 {
		v[0] |= jobHasWindow
		v = binary.BigEndian.AppendUint32(v, uint32(windowMs))
	}
	if nonce != 0 {
		v[0] |= jobHasNonce
		v = binary.BigEndian.AppendUint32(v, nonce)
	}
	v = append(v, topic...)
	return append(v, body...)
}

func putUint48(b []byte, n uint64) {
	binary.BigEndian.PutUint16(b, uint16(n>>32))
	binary.BigEndian.PutUint32(b[2:], uint32(n))
}

func uint48(b []byte) int64 {
	return int64(binary.BigEndian.Uint16(b))<<32 | int64(binary.BigEndian.Uint32(b[2:]))
}

// decodeJob reads a job as job.lua encodes it.
func decodeJob(id string, v []byte) (*Job, error) {
	corrupt := func(why string) (*Job, error) {
		return nil, fmt.Errorf("delayqueue: job %q: corrupt encoding: %s", id, why)
	}
	if len(v) < jobHeaderLen {
		return corrupt("short header")
	}
	if v[0]>>6 != jobFormatVersion {
		return nil, fmt.Errorf("delayqueue: job %q: unknown encoding format %d", id, v[0]>>6)
	}
	state := State(v[0] & 7)
	if state < StateDelayed || state > StateDead {
		return corrupt(fmt.Sprintf("state %d", state))
	}
	rest := v[jobHeaderLen:]
	errLen := 0
	if v[0]&jobHasError != 0 {
		if len(rest) < 2 {
			return corrupt("short error length")
		}
		errLen, rest = int(binary.BigEndian.Uint16(rest)), rest[2:]
	}
	var window time.Duration
	if v[0]&jobHasWindow != 0 {
		if len(rest) < 4 {
			return corrupt("short dedup window")
		}
		window, rest = time.Duration(binary.BigEndian.Uint32(rest))*time.Millisecond, rest[4:]
	}
	var nonce uint32
	if v[0]&jobHasNonce != 0 {
		if len(rest) < 4 {
			return corrupt("short push nonce")
		}
		nonce, rest = binary.BigEndian.Uint32(rest), rest[4:]
	}
	topicLen := int(v[21])
	if len(rest) < topicLen+errLen {
		return corrupt("short topic or error")
	}
	job := &Job{
		ID:          id,
		Topic:       string(rest[:topicLen]),
		LastError:   string(rest[topicLen : topicLen+errLen]),
		Body:        rest[topicLen+errLen:],
		State:       state,
		Attempts:    int(binary.BigEndian.Uint16(v[1:])),
		MaxAttempts: int(binary.BigEndian.Uint16(v[3:])),
		TTR:         time.Duration(binary.BigEndian.Uint32(v[5:])) * time.Millisecond,
		DedupWindow: window,
		lease:       uint48(v[15:]),
		nonce:       nonce,
	}
	at := time.UnixMilli(uint48(v[9:]))
	if job.State == StateReserved {
		job.ReservedUntil = at
	} else {
		job.RunAt = at
	}
	return job, nil
}
