package delayqueue

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Errors returned by the queue. Match them with errors.Is: the returned error
// usually wraps one of these with detail.
var (
	// ErrNoJob is returned by Pop when no job became ready within its timeout.
	ErrNoJob = errors.New("delayqueue: no job ready")
	// ErrNotFound is returned when no job has the given ID: it never existed,
	// was finished, or was removed.
	ErrNotFound = errors.New("delayqueue: job not found")
	// ErrNotReserved is returned by Finish for a job that exists but is not
	// reserved by a consumer (it is delayed, ready or dead).
	ErrNotReserved = errors.New("delayqueue: job not reserved")
	// ErrReservationLost is returned by Retry, Touch, Release and Finish
	// when the caller's reservation of the job is gone: it ran out and the
	// job went back to ready or to another consumer, or the job was
	// released.
	// Nothing was changed, unless by the first run of this very call: a
	// call whose reply was lost is sent again by go-redis, and the second
	// run finds the reservation its first run settled gone.
	ErrReservationLost = errors.New("delayqueue: reservation lost")
	// ErrNotPending is returned by RescheduleIn and RescheduleAt for a job
	// that is reserved or dead: only delayed and ready jobs can be moved.
	ErrNotPending = errors.New("delayqueue: job not pending")
	// ErrInvalidJob is returned for a job that cannot be pushed: nil, a bad
	// topic or ID, a negative delay or TTR, a body over the limit. Nothing is
	// written to Redis.
	ErrInvalidJob = errors.New("delayqueue: invalid job")
	// ErrInvalidTopic is returned for a topic that is not 1 to 200 bytes of
	// printable UTF-8 with no spaces, '{' or '}' (which would change a key's
	// hash tag). It comes together with ErrInvalidJob when a job carries it.
	ErrInvalidTopic = errors.New("delayqueue: invalid topic")
	// ErrBodyTooLarge is returned, together with ErrInvalidJob, for a body
	// over the limit set by WithMaxBodySize.
	ErrBodyTooLarge = errors.New("delayqueue: body too large")
	// ErrInvalidID is returned for an ID that no job can have: an ID is 1
	// to 200 bytes with no control characters, and only the IDs the queue
	// generates begin with "~".
	ErrInvalidID = errors.New("delayqueue: invalid job id")
	// ErrInvalidLimits is returned by SetLimits for limits out of range.
	ErrInvalidLimits = errors.New("delayqueue: invalid limits")
	// ErrInvalidOption is returned by New for an option out of range.
	ErrInvalidOption = errors.New("delayqueue: invalid option")
	// ErrBucketMismatch is returned by New when the queue's data in Redis was
	// written with a different bucket count.
	ErrBucketMismatch = errors.New("delayqueue: bucket count differs from the one stored in Redis")
	// ErrFormatMismatch is returned by New when the queue's jobs in Redis
	// were written by a version of this package that encodes jobs
	// differently: drain the queue with that version, or use another name.
	ErrFormatMismatch = errors.New("delayqueue: jobs in Redis are encoded by another version")
	// ErrInvalidCursor is returned by List for a cursor it did not make
	// for the same topic, state and bucket count.
	ErrInvalidCursor = errors.New("delayqueue: invalid cursor")
	// ErrInvalidState is returned by List for a State that is not
	// StateDelayed, StateReady, StateReserved or StateDead.
	ErrInvalidState = errors.New("delayqueue: invalid state")
	// ErrInvalidLimit is returned by List for a page size out of range.
	ErrInvalidLimit = errors.New("delayqueue: invalid limit")
	// ErrOutOfMemory is returned, together with Redis's own error, when
	// Redis refuses a write because it is at maxmemory (with the
	// noeviction policy). Push, PushMany, Upsert and the reschedules are
	// refused before they change anything; consuming (which frees memory),
	// removing and reading go on working.
	ErrOutOfMemory = errors.New("delayqueue: Redis is out of memory")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("delayqueue: queue closed")
	// ErrStarted is returned by Start when the queue was started already.
	ErrStarted = errors.New("delayqueue: queue already started")
	// ErrInvalidSchedule is returned by Schedule for a schedule it refuses:
	// no name or a bad one, neither or both of Every and Cron, an Every
	// under 1ms, a Cron that does not parse. A bad Job matches
	// ErrInvalidJob too. Nothing is written to Redis.
	ErrInvalidSchedule = errors.New("delayqueue: invalid schedule")
)

// both is an error that matches every error in errs (errors.Is, errors.As)
// and reads as msg: for an error that is two of ours at once, such as
// ErrInvalidJob and ErrInvalidTopic, without saying "delayqueue:" twice.
type both struct {
	msg  string
	errs []error
}

func (e *both) Error() string   { return e.msg }
func (e *both) Unwrap() []error { return e.errs }

// within returns cause as one instance of kind: it matches both, and
// reads "delayqueue: <kind>: <cause without its own prefix>".
func within(kind, cause error) error {
	return &both{
		msg:  kind.Error() + ": " + strings.TrimPrefix(cause.Error(), "delayqueue: "),
		errs: []error{kind, cause},
	}
}

// redisError returns an error of Redis's as the package reports it: an OOM
// refusal matches ErrOutOfMemory too. Other errors, and nil, are returned
// as they are.
func redisError(err error) error {
	if redis.HasErrorPrefix(err, "OOM") {
		return within(ErrOutOfMemory, err)
	}
	return err
}
