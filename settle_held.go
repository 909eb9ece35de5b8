package delayqueue

import (
	"sync"
	"time"
)

// The reservations a DelayQueue popped and has not settled, so that a plain
// Finish(ctx, id) is checked against the reservation this instance got:
// once it ran out and the job went to another consumer, a late Finish must
// not delete the job the other one holds.

// heldHorizon is how long after its reservation ran out an unsettled one is
// remembered. Past it, Finish of that ID finishes whatever reservation the
// job has, as for a job this instance never popped.
const heldHorizon = time.Hour

type heldSet struct {
	mu      sync.Mutex
	jobs    map[string]heldJob // by job ID: the latest reservation popped
	pruneAt int                // prune when the map grows to this
}

type heldJob struct {
	reservation int64
	until       time.Time // when the reservation runs out, on this process's clock, at the latest
	topic       string
	grant       string // its capacity grant, for a limited topic
}

// add records reservations just popped; since is when the pop was sent.
func (s *heldSet) add(jobs []*Job, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jobs == nil {
		s.jobs = map[string]heldJob{}
	}
	for _, job := range jobs {
		s.jobs[job.ID] = heldJob{job.reservation, since.Add(job.TTR), job.Topic, job.grant}
	}
	if len(s.jobs) >= s.pruneAt {
		cutoff := time.Now().Add(-heldHorizon)
		for id, h := range s.jobs {
			if h.until.Before(cutoff) {
				delete(s.jobs, id)
			}
		}
		s.pruneAt = max(2*len(s.jobs), 1024)
	}
}

// reservation returns the number of the reservation of id that this
// instance popped, and the job's topic, or 0 and "" for none (or one that
// ran out more than heldHorizon ago).
func (s *heldSet) reservation(id string) (int64, string) {
	h := s.get(id)
	return h.reservation, h.topic
}

// get returns what this instance popped of id; the zero heldJob for none
// (or one that ran out more than heldHorizon ago).
func (s *heldSet) get(id string) heldJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.jobs[id]
	if !ok || time.Since(h.until) > heldHorizon {
		return heldJob{}
	}
	return h
}

// extend records that the reservation under reservation runs until until.
func (s *heldSet) extend(id string, reservation int64, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.jobs[id]; ok && h.reservation == reservation {
		h.until = until
		s.jobs[id] = h
	}
}

// settled forgets the reservation of id under reservation (0: whichever).
func (s *heldSet) settled(id string, reservation int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.jobs[id]; ok && (reservation == 0 || h.reservation == reservation) {
		delete(s.jobs, id)
	}
}
