package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/spf13/cobra"
)

// The commands that count: stats, topics, watch.

// countsJSON is a delayqueue.Counts as --json prints it.
type countsJSON struct {
	Delayed            int     `json:"delayed"`
	Ready              int     `json:"ready"`
	Reserved           int     `json:"reserved"`
	Dead               int     `json:"dead"`
	OldestReadySeconds float64 `json:"oldest_ready_s"`
}

func countsToJSON(c delayqueue.Counts) countsJSON {
	return countsJSON{c.Delayed, c.Ready, c.Reserved, c.Dead, c.OldestReady.Seconds()}
}

// topicJSON is one topic's line of stats and watch.
type topicJSON struct {
	Topic string `json:"topic"`
	countsJSON
	Paused bool `json:"paused"`
	// Rates are watch's net changes per second since the refresh before;
	// absent on the first.
	Rates *ratesJSON `json:"rates_per_s,omitempty"`
}

type ratesJSON struct {
	Delayed  float64 `json:"delayed"`
	Ready    float64 `json:"ready"`
	Reserved float64 `json:"reserved"`
	Dead     float64 `json:"dead"`
}

// topicsOf lists an overview's topics in order, each with its paused flag.
func topicsOf(ov delayqueue.Overview) []topicJSON {
	var out []topicJSON
	for name, c := range ov.Topics {
		out = append(out, topicJSON{Topic: name, countsJSON: countsToJSON(c), Paused: slices.Contains(ov.Paused, name)})
	}
	slices.SortFunc(out, func(a, b topicJSON) int { return cmp.Compare(a.Topic, b.Topic) })
	return out
}

func (a *app) statsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Count each topic's jobs by state, with the oldest ready job's age",
		Long: `Count each topic's jobs by state, with the age of its oldest ready job (how
far behind its consumers are) and whether it is paused, and the totals.`,
		Args: exactArgs(0),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			ov, err := q.Overview(ctx)
			if err != nil {
				return err
			}
			topics := topicsOf(ov)
			if a.json {
				return printJSON(a.stdout, struct {
					Queue   string      `json:"queue"`
					Buckets int         `json:"buckets"`
					Jobs    int         `json:"jobs"`
					Topics  []topicJSON `json:"topics"`
					Total   countsJSON  `json:"total"`
				}{a.conn.queue, ov.Buckets, ov.Jobs, append([]topicJSON{}, topics...), countsToJSON(ov.Total)})
			}
			t := newTable(a.stdout, "TOPIC", "DELAYED", "READY", "RESERVED", "DEAD", "OLDEST READY", "PAUSED")
			for _, tp := range topics {
				t.row(countCells(escape(tp.Topic, 40), ov.Topics[tp.Topic], nil, yesNo(tp.Paused))...)
			}
			t.row(countCells("TOTAL", ov.Total, nil, "")...)
			if err := t.flush(); err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "queue %s: %d jobs in %d bucket(s)\n", a.conn.queue, ov.Jobs, ov.Buckets)
			return err
		}),
	}
}

// countCells are a table row of counts, each with its rate when rates is
// not nil.
func countCells(name string, c delayqueue.Counts, rates *ratesJSON, paused string) []string {
	cell := func(n int, rate func(*ratesJSON) float64) string {
		if rates == nil {
			return strconv.Itoa(n)
		}
		return fmt.Sprintf("%d (%+.1f/s)", n, rate(rates))
	}
	return []string{name,
		cell(c.Delayed, func(r *ratesJSON) float64 { return r.Delayed }),
		cell(c.Ready, func(r *ratesJSON) float64 { return r.Ready }),
		cell(c.Reserved, func(r *ratesJSON) float64 { return r.Reserved }),
		cell(c.Dead, func(r *ratesJSON) float64 { return r.Dead }),
		age(c.OldestReady), paused}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (a *app) topicsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "topics",
		Short: "List the topics that have jobs or are paused",
		Args:  exactArgs(0),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			ov, err := q.Overview(ctx)
			if err != nil {
				return err
			}
			topics := make([]string, 0, len(ov.Topics))
			for tp := range ov.Topics {
				topics = append(topics, tp)
			}
			slices.Sort(topics)
			if a.json {
				return printJSON(a.stdout, append([]string{}, topics...))
			}
			for _, tp := range topics {
				fmt.Fprintln(a.stdout, escape(tp, 200))
			}
			return nil
		}),
	}
}

const watchHelp = `Show each topic's counts by state every --interval until Ctrl-C, with the
lateness (the age of the oldest ready job) and the rates: the net change of
each count per second since the refresh before. A rate is not a throughput:
a ready count that stays the same while consumers keep up shows +0.0/s.
On a terminal the screen is redrawn; otherwise the refreshes follow one
another (with --json: one JSON document per refresh). When Redis cannot
be read, watch says so on stderr and tries again at the next refresh; the
rates start over once it reads again. With --count, a refresh that failed
counts as one, and watch exits 1 when any failed.`

func (a *app) watchCommand() *cobra.Command {
	var (
		interval time.Duration
		count    int
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Show the counts, their rates and the lateness, refreshing",
		Long:  watchHelp,
		Args:  exactArgs(0),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, _ []string) error {
			if interval <= 0 {
				return usagef("--interval must be positive")
			}
			return a.watch(ctx, q, interval, count)
		}),
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between refreshes")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many refreshes (0: until Ctrl-C)")
	return cmd
}

func (a *app) watch(ctx context.Context, q *delayqueue.DelayQueue, interval time.Duration, count int) error {
	clear := !a.json && isTerminal(asFile(a.stdout))
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var prev delayqueue.Overview
	var prevAt time.Time
	var failed error // the last refresh that failed
	fails := 0
	// At --count, or on Ctrl-C while Redis cannot be read, say so.
	end := func(latest error) error {
		switch {
		case latest != nil && count == 0:
			return latest
		case fails > 0 && count > 0:
			return fmt.Errorf("%d of %d refreshes failed; the last: %w", fails, count, failed)
		}
		return nil
	}
	for n := 1; ; n++ {
		ov, err := q.Overview(ctx)
		if ctx.Err() != nil {
			return end(nil) // Ctrl-C during the call
		}
		if err != nil {
			// A failover or a restart: say so, and look again.
			failed, fails = err, fails+1
			prevAt = time.Time{}
			if n == count {
				return end(err)
			}
			fmt.Fprintf(a.stderr, "dqctl: %s: %v; trying again in %v\n", time.Now().Format("15:04:05"), err, interval)
			// The tick that came while the call failed, slowly, is no
			// reason to try again at once.
			tick.Reset(interval)
			select {
			case <-tick.C:
			default:
			}
			select {
			case <-ctx.Done():
				return end(err)
			case <-tick.C:
			}
			continue
		}
		now := time.Now()
		topics := topicsOf(ov)
		if !prevAt.IsZero() {
			secs := now.Sub(prevAt).Seconds()
			for i, tp := range topics {
				was, cur := prev.Topics[tp.Topic], ov.Topics[tp.Topic]
				topics[i].Rates = &ratesJSON{
					Delayed:  float64(cur.Delayed-was.Delayed) / secs,
					Ready:    float64(cur.Ready-was.Ready) / secs,
					Reserved: float64(cur.Reserved-was.Reserved) / secs,
					Dead:     float64(cur.Dead-was.Dead) / secs,
				}
			}
		}
		if err := a.printWatch(ov, topics, now, clear); err != nil {
			return err
		}
		prev, prevAt = ov, now
		if n == count {
			return end(nil)
		}
		select {
		case <-ctx.Done():
			return end(nil)
		case <-tick.C:
		}
	}
}

func (a *app) printWatch(ov delayqueue.Overview, topics []topicJSON, now time.Time, clear bool) error {
	if a.json {
		return printJSON(a.stdout, struct {
			Time   string      `json:"time"`
			Topics []topicJSON `json:"topics"`
		}{rfc3339(now), append([]topicJSON{}, topics...)})
	}
	if clear {
		fmt.Fprint(a.stdout, "\x1b[H\x1b[2J") // home, clear screen
	}
	fmt.Fprintf(a.stdout, "queue %s at %s; rates are net changes of the counts per second, not throughput\n",
		a.conn.queue, now.Format("15:04:05"))
	t := newTable(a.stdout, "TOPIC", "DELAYED", "READY", "RESERVED", "DEAD", "LATENESS", "PAUSED")
	for _, tp := range topics {
		t.row(countCells(escape(tp.Topic, 40), ov.Topics[tp.Topic], tp.Rates, yesNo(tp.Paused))...)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if !clear {
		fmt.Fprintln(a.stdout)
	}
	return nil
}
