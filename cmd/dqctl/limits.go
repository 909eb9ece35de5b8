package main

import (
	"context"
	"strconv"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/spf13/cobra"
)

// The limits command: set, show and clear a topic's limits.

func (a *app) limitsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Set, show or clear a topic's limits, which every process obeys",
	}
	var l delayqueue.Limits
	set := &cobra.Command{
		Use:   "set <topic>",
		Short: "Limit how many of a topic's jobs are reserved at once, and per period",
		Args:  exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			if err := q.SetLimits(ctx, args[0], l); err != nil {
				return err
			}
			return a.showLimits(ctx, q, args[0])
		}),
	}
	set.Flags().IntVar(&l.Concurrency, "concurrency", 0, "at most this many reserved at once (0: no limit)")
	set.Flags().IntVar(&l.Rate, "rate", 0, "at most this many reserved per --per (0: no limit)")
	set.Flags().DurationVar(&l.Per, "per", 0, "the rate's window (default 1s)")
	show := &cobra.Command{
		Use:   "show <topic>",
		Short: "Show a topic's limits and how much of them is in use",
		Args:  exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			return a.showLimits(ctx, q, args[0])
		}),
	}
	clear := &cobra.Command{
		Use:   "clear <topic>",
		Short: "Remove a topic's limits",
		Args:  exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			if err := q.SetLimits(ctx, args[0], delayqueue.Limits{}); err != nil {
				return err
			}
			return a.done(map[string]any{"topic": args[0], "limited": false}, "cleared the limits of %s", escape(args[0], 200))
		}),
	}
	cmd.AddCommand(set, show, clear)
	return cmd
}

// showLimits prints topic's limits and their use.
func (a *app) showLimits(ctx context.Context, q *delayqueue.DelayQueue, topic string) error {
	ov, err := q.Overview(ctx)
	if err != nil {
		return err
	}
	u := ov.Limits[topic]
	if a.json {
		return printJSON(a.stdout, map[string]any{"topic": topic, "concurrency": u.Concurrency, "rate": u.Rate,
			"per": u.Per.String(), "running": u.Running, "in_window": u.InWindow})
	}
	t := newTable(a.stdout)
	t.row("Topic", escape(topic, 200))
	t.row("Concurrency", limitText(u.Concurrency, u.Running))
	t.row("Rate", limitText(u.Rate, u.InWindow)+" per "+perText(u.Per))
	return t.flush()
}

func limitText(limit, used int) string {
	if limit == 0 {
		return "none"
	}
	return strconv.Itoa(used) + " of " + strconv.Itoa(limit)
}

func perText(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}
