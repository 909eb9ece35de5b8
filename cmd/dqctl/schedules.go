package main

import (
	"context"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/spf13/cobra"
)

// scheduleRow is one schedule as schedules --json prints it.
type scheduleRow struct {
	Name     string    `json:"name"`
	Every    string    `json:"every,omitempty"`
	Cron     string    `json:"cron,omitempty"`
	Location string    `json:"location"`
	Topic    string    `json:"topic"`
	Paused   bool      `json:"paused"`
	Next     time.Time `json:"next,omitzero"`
	Last     time.Time `json:"last,omitzero"`
}

func (a *app) schedulesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "List the periodic schedules with their next and last tick",
		Args:  exactArgs(0),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, _ []string) error {
			list, err := q.Schedules(ctx)
			if err != nil {
				return err
			}
			rows := make([]scheduleRow, len(list))
			for i, s := range list {
				rows[i] = scheduleRow{Name: s.Name, Cron: s.Cron, Location: s.Location.String(), Topic: s.Job.Topic,
					Paused: s.Paused, Next: s.Next, Last: s.Last}
				if s.Every > 0 {
					rows[i].Every = s.Every.String()
				}
			}
			if a.json {
				return printJSON(a.stdout, rows)
			}
			t := newTable(a.stdout, "NAME", "EVERY/CRON", "LOCATION", "TOPIC", "PAUSED", "NEXT", "LAST")
			for _, r := range rows {
				t.row(escape(r.Name, 60), escape(r.Every+r.Cron, 40), escape(r.Location, 40), escape(r.Topic, 60),
					yesNo(r.Paused), stamp(r.Next), stamp(r.Last))
			}
			return t.flush()
		}),
	}
	for _, sub := range []struct {
		use, short, said string
		op               func(*delayqueue.DelayQueue, context.Context, string) error
	}{
		{"pause <name>", "Stop a schedule from pushing jobs", "paused", (*delayqueue.DelayQueue).PauseSchedule},
		{"resume <name>", "Have a paused schedule tick again", "resumed", (*delayqueue.DelayQueue).ResumeSchedule},
		{"remove <name>", "Delete a schedule", "removed", (*delayqueue.DelayQueue).Unschedule},
	} {
		cmd.AddCommand(&cobra.Command{
			Use: sub.use, Short: sub.short, Args: exactArgs(1),
			RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
				if err := sub.op(q, ctx, args[0]); err != nil {
					return err
				}
				return a.done(map[string]any{"schedule": args[0], sub.said: true}, "%s schedule %s", sub.said, args[0])
			}),
		})
	}
	return cmd
}

// stamp shows a time in UTC to the millisecond, or "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}
