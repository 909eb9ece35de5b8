package delayqueue

import (
	"errors"
	"fmt"
	"time"
)

// Handler outcomes. A Consume handler returns nil to finish its job, and an
// error to retry it after the queue's backoff; these errors say otherwise.
// They may be wrapped (fmt.Errorf with %w), and Retry honours them too.
// When an error names more than one, the outermost wins: RetryIn(d, err)
// retries after d even when err wraps ErrSkipRetry or a Snooze, and in a
// joined error (errors.Join) the first that names one wins.

// ErrSkipRetry, returned by a handler or wrapped in its error, sends the
// job to the dead letters at once, whatever attempts it has left, with the
// error as its LastError: for a failure that no retry can mend, such as a
// webhook answered 404.
//
//	return fmt.Errorf("webhook answered %d: %w", resp.StatusCode, delayqueue.ErrSkipRetry)
var ErrSkipRetry = errors.New("delayqueue: skip retry")

// RetryIn returns an error that, returned by a handler, retries the job
// after delay instead of the queue's backoff: for a server that said when
// to come back (HTTP 429 with Retry-After). The attempt counts, as a
// failure: a job out of attempts goes to the dead letters, and the retry is
// logged and observed as one. cause becomes its LastError. For a wait that
// is no failure of the job's (a shared limit reached), use Snooze, or a
// topic limit (SetLimits) that holds jobs back before they are reserved.
// A negative delay retries at once (a Retry-After date already past).
func RetryIn(delay time.Duration, cause error) error {
	return &RetryInError{Delay: delay, Cause: cause}
}

// RetryInError is what RetryIn returns; match it with errors.As.
type RetryInError struct {
	Delay time.Duration
	Cause error
}

func (e *RetryInError) Error() string {
	if e == nil {
		return "delayqueue: retry in <nil>"
	}
	if e.Cause == nil {
		return fmt.Sprintf("delayqueue: retry in %v", e.Delay)
	}
	return fmt.Sprintf("delayqueue: retry in %v: %v", e.Delay, e.Cause)
}

func (e *RetryInError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Cause
}

// Snooze returns an error that, returned by a handler, puts the job back
// for delay without counting the attempt and without recording an error:
// for a job that is not ready to be done yet (a rate limit of its own, a
// resource still being prepared). A job snoozed forever never reaches the
// dead letters. Consume logs it at debug level, not as a failure, and
// the Observer sees EventSnoozed, not EventRetried. A negative delay puts
// it back at once.
func Snooze(delay time.Duration) error {
	return &SnoozeError{Delay: delay}
}

// SnoozeError is what Snooze returns; match it with errors.As.
type SnoozeError struct {
	Delay time.Duration
}

func (e *SnoozeError) Error() string {
	if e == nil {
		return "delayqueue: snooze <nil>"
	}
	return fmt.Sprintf("delayqueue: snooze for %v", e.Delay)
}

// outcomeOf returns the outcome err names: ErrSkipRetry, a *SnoozeError or
// a *RetryInError, the outermost met going down its chain (a joined
// error's in order); nil when it names none. A nil *SnoozeError or
// *RetryInError names none.
func outcomeOf(err error) error {
	for err != nil {
		switch e := err.(type) {
		case *SnoozeError:
			if e != nil {
				return e
			}
		case *RetryInError:
			if e != nil {
				return e
			}
		}
		if is, ok := err.(interface{ Is(error) bool }); err == ErrSkipRetry || ok && is.Is(ErrSkipRetry) {
			return ErrSkipRetry
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if o := outcomeOf(e); o != nil {
					return o
				}
			}
			return nil
		default:
			return nil
		}
	}
	return nil
}
