package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Scenario c (churn) runs the queue as a fleet of workers that restarts all
// day: while the jobs fall due, two consumer processes picked at random
// are killed at once (-k-signal: SIGKILL, or SIGSTOP to freeze them), as
// two pods on one node are, every 3–6 s, and each is replaced by a new
// process 1–3 s later. Any two of them may be a bucket's lease holder and
// its standby. It reports the lateness of the jobs delivered at their
// first attempt, and counts the jobs a killed process held, which come
// back after their TTR.

// churner kills and replaces the consumer processes of one run.
type churner struct {
	f     *fleet
	args  []string // a consumer's command line
	kill  func(p *proc) error
	until time.Time // no kill after this

	live     []*proc // consumers neither killed nor frozen
	victims  map[*proc]bool
	next     *time.Timer   // the next kill
	restarts chan string   // names of processes to start again, when due
	timers   []*time.Timer // the restarts planned
}

// newChurner plans the first kill at first.
func newChurner(f *fleet, args []string, kill func(p *proc) error, first, until time.Time) *churner {
	c := &churner{f: f, args: args, kill: kill, until: until, victims: map[*proc]bool{},
		next: time.NewTimer(time.Until(first)), restarts: make(chan string, 64)}
	for _, p := range f.procs {
		if strings.HasPrefix(p.name, "consumer") {
			c.live = append(c.live, p)
		}
	}
	return c
}

// strike kills two live consumers at once, plans their replacements, and
// plans the next strike. With fewer than three alive (the last ones
// killed not replaced yet), it kills none: one is left to take the jobs.
func (c *churner) strike() error {
	for range 2 {
		if len(c.live) < 3 {
			break
		}
		i := rand.IntN(len(c.live))
		p := c.live[i]
		c.live = slices.Delete(c.live, i, i+1)
		if err := c.kill(p); err != nil {
			return fmt.Errorf("churn: %s: %w", p.name, err)
		}
		c.victims[p] = true
		name := p.name
		c.timers = append(c.timers, time.AfterFunc(between(time.Second, 3*time.Second), func() { c.restarts <- name }))
	}
	if at := time.Now().Add(between(3*time.Second, 6*time.Second)); at.Before(c.until) {
		c.next.Reset(time.Until(at))
	}
	return nil
}

// restart starts a new consumer in the place of the one named.
func (c *churner) restart(name string) error {
	p, err := c.f.start(name, "consumer", c.args...)
	if err != nil {
		return err
	}
	c.live = append(c.live, p)
	return nil
}

// stop plans nothing more. The victims leave the fleet: a frozen one is
// killed; either way its end is the scenario's.
func (c *churner) stop() {
	c.next.Stop()
	for _, t := range c.timers {
		t.Stop()
	}
	for p := range c.victims {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	c.f.procs = slices.DeleteFunc(c.f.procs, func(p *proc) bool { return c.victims[p] })
}

// between is a random duration in [lo, hi).
func between(lo, hi time.Duration) time.Duration {
	return lo + rand.N(hi-lo)
}

// churnFigures are the lateness of the jobs delivered at their first
// attempt, and the count of those delivered first at a later one: a killed
// process held them, and they came back after their TTR.
func churnFigures(o *outcome) ([]float64, error) {
	if o.kills == 0 {
		return nil, errors.New("the run ended before a process was killed")
	}
	var lates []time.Duration
	later := 0
	for _, r := range o.got.firsts {
		if r.attempt == 1 {
			lates = append(lates, r.at.Sub(r.due))
		} else {
			later++
		}
	}
	if len(lates) == 0 {
		return nil, errors.New("no job was delivered at its first attempt")
	}
	slices.Sort(lates)
	return []float64{percentile(lates, 50), percentile(lates, 99), percentile(lates, 100), float64(later),
		float64(o.got.early), float64(o.jobs - o.got.distinct), float64(o.got.total - o.got.distinct), float64(o.kills)}, nil
}
