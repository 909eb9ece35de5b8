package delayqueue

// The codes the scripts answer with, one block per script. Each script
// names the same numbers under the same names in upper case (finishLost is
// finish.lua's FINISH_LOST); TestScriptRepliesAreGos checks that they agree.

// push.lua's answer for a job.
const (
	pushCreated = 1  // stored under its ID
	pushExisted = 0  // a caller's ID that exists already: nothing changed
	pushTaken   = -1 // a generated ID held by another job: nothing changed
)

// upsert.lua's answer, first in its reply.
const (
	upsertCreated  = 1
	upsertReplaced = 0
)

// move.lua's answers for a caller that does not hold the lease, first in
// its reply (a holder's is how many jobs it moved).
const (
	moveNeither = -1 // others hold the lease and both standby leases
	moveStandby = -2 // the caller stands by
	moveSecond  = -3 // the caller is the second standby
)

// move.lua's flags, third in a holder's reply and fourth in a standby's.
const (
	moveFresh   = 1 // the call took a free lease or the bucket over
	moveVacated = 2 // the call freed a standby lease
	moveSooner  = 4 // the second standby is to look sooner (a standby's reply)
)

// reserveStatus says how a reserve call ended, first in reserve.lua's reply.
type reserveStatus int

const (
	reserveRanOut reserveStatus = 0 // the list, or the signals, ran out
	reserveFilled reserveStatus = 1 // it got every job it asked for
	reserveStale  reserveStatus = 2 // it dropped staleSkips stale IDs; the list may hold more
	reservePaused reserveStatus = 3 // the topic is paused; the signals held were put back
	// a call that came only to claim signals (reserveClaim) found none:
	// other processes took them first. It says reserveNoSignal or
	// reserveDry as a look would, from the list's length alone.
	reserveUnclaimed reserveStatus = 4
)

// reserveMode is how a reserve call takes jobs (reserve.lua's ARGV[8]).
type reserveMode int

const (
	// reserveSignalled takes no more jobs than the signals the caller
	// holds or claims, and looks at the list when there are none.
	reserveSignalled reserveMode = 0
	// reserveGreedy takes as many jobs as asked, whatever the signals: a
	// consumer that will not wait.
	reserveGreedy reserveMode = 1
	// reserveClaim comes for signals another call's reply said were left:
	// holding none and finding none, it reads only the list's length.
	reserveClaim reserveMode = 2
	// reserveLost looks for a job whose signal was lost: holding none and
	// finding none, it looks only if no other call did in the last
	// second, and otherwise reads only the list's length.
	reserveLost reserveMode = 3
)

// with is the mode of a call that goes for requests of modes m and o
// together: it looks if one of them would, whatever the others came for.
func (m reserveMode) with(o reserveMode) reserveMode {
	rank := func(m reserveMode) int {
		switch m {
		case reserveClaim:
			return 0
		case reserveLost:
			return 1
		}
		return 2
	}
	if rank(o) > rank(m) {
		return o
	}
	return m
}

// reserveNoSignal stands in reserve.lua's reply for the signals left when
// none is, and the list still holds jobs (their signals are on their way,
// or were lost).
const reserveNoSignal = -1

// reserveDry stands in reserve.lua's reply for the signals left when none
// is, and the call read the list to its end: it holds no job.
const reserveDry = -2

// finish.lua's answer for a job.
const (
	finishDone        = 1
	finishNoJob       = 0
	finishNotReserved = -1
	finishLost        = -2 // the caller's reservation is gone
)

// The status of the scripts that settle a job under a reservation
// (retry.lua, release.lua), first in their reply when the job is not held:
// lib/held.lua's.
const (
	heldNoJob = 0
	heldLost  = -1 // the caller's reservation is gone
)

// retry.lua's answer, first in its reply, when the job was held.
const (
	retryAgain = 1 // to be delivered again; its due time follows
	retryDied  = 2 // moved to the dead letters
)

// release.lua's answer when the job was held.
const releaseDone = 1

// touch.lua's answer for a job whose reservation it did not extend (else
// the new deadline).
const (
	touchNoJob = 0
	touchLost  = -1 // the caller's reservation is gone
)

// reschedule.lua's answer, first in its reply.
const (
	rescheduleDone       = 1 // its due time follows
	rescheduleNoJob      = 0
	rescheduleNotPending = -1 // the job is reserved or dead
)

// remove.lua's answer.
const (
	removeDone  = 1
	removeNoJob = 0
)

// unlock.lua's answer.
const (
	unlockReleased = 1
	unlockNotHeld  = 0
)

// schedule.lua's answer for a schedule.
const (
	scheduleChanged   = 1
	scheduleNotAsRead = 0
)

// acquire.lua's answer, in place of how many grants it granted, when the
// topic has no limits.
const acquireNoLimits = -1

// renew.lua's answer for a grant.
const (
	renewDone = 1
	renewKept = 0
)
