package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/spf13/cobra"
)

// The commands on jobs: list, get, push, remove.

func (a *app) listCommand() *cobra.Command {
	var (
		state  string
		cursor string
		limit  int
		all    bool
	)
	cmd := &cobra.Command{
		Use:   "list <topic>",
		Short: "List a topic's jobs in one state, a page at a time",
		Long: `List a topic's jobs in one state: delayed jobs by due time, ready jobs by
arrival, reserved jobs by reservation deadline, dead jobs by time of death.
A page holds at most --limit jobs (it may hold fewer, even none, while
more follow); when more follow, the cursor to pass as --cursor is printed
on stderr, or as "next" with --json. --all follows the cursors to the end.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Before connecting: bad input is a usage error, Redis or not.
			st, err := delayqueue.ParseState(state)
			if err != nil {
				return err
			}
			if limit < 1 || limit > 1000 { // the library reads 0 as its default page
				return fmt.Errorf("%w: --limit %d; a page holds 1 to 1000 jobs", delayqueue.ErrInvalidLimit, limit)
			}
			return a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
				return a.list(ctx, q, args[0], st, cursor, limit, all)
			})(cmd, args)
		},
	}
	cmd.Flags().StringVar(&state, "state", "ready", "`state` of the jobs: delayed, ready, reserved or dead")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue a listing where the page before ended")
	cmd.Flags().IntVar(&limit, "limit", 100, "most jobs per page, 1 to 1000")
	cmd.Flags().BoolVar(&all, "all", false, "list every page")
	return cmd
}

// list prints a page of topic's jobs in state st from cursor, or with all
// every page to the end.
func (a *app) list(ctx context.Context, q *delayqueue.DelayQueue, topic string, st delayqueue.State, cursor string, limit int, all bool) error {
	var jobs []*delayqueue.Job
	for {
		page, err := q.List(ctx, topic, st, delayqueue.ListOptions{Cursor: cursor, Limit: limit})
		if err != nil {
			return err
		}
		jobs, cursor = append(jobs, page.Jobs...), page.Next
		if !all || cursor == "" {
			break
		}
	}
	return a.printJobs(ctx, st, jobs, cursor)
}

func (a *app) printJobs(ctx context.Context, st delayqueue.State, jobs []*delayqueue.Job, next string) error {
	if a.json {
		out := struct {
			Jobs []jobJSON `json:"jobs"`
			Next string    `json:"next"`
		}{Jobs: []jobJSON{}, Next: next}
		for _, j := range jobs {
			out.Jobs = append(out.Jobs, toJSON(j))
		}
		return printJSON(a.stdout, out)
	}
	now := a.serverNow(ctx)
	name, _ := when(&delayqueue.Job{State: st})
	t := newTable(a.stdout, "ID", "STATE", strings.ToUpper(name), "ATTEMPTS", "TOPIC", "LAST ERROR", "BODY")
	for _, j := range jobs {
		_, at := when(j)
		t.row(escape(j.ID, 40), j.State.String(), span(at.Sub(now)), fmt.Sprintf("%d/%d", j.Attempts, j.MaxAttempts),
			escape(j.Topic, 30), orDash(escape(j.LastError, 30)), bodyPreview(j.Body, 40))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(a.stderr, "more jobs follow: --cursor %s\n", next)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) getCommand() *cobra.Command {
	var raw bool
	cmd := &cobra.Command{
		Use:   "get <id>",
		Short: "Show one job: its fields, headers and body",
		Long: `Show one job: its fields, headers and body. A body of printable UTF-8 is
shown as it is, any other as a hex dump; --raw writes only the body's bytes.`,
		Args: exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			j, err := q.Get(ctx, args[0])
			switch {
			case err != nil:
				return err
			case raw:
				_, err = a.stdout.Write(j.Body)
				return err
			case a.json:
				return printJSON(a.stdout, toJSON(j))
			}
			return a.printJob(j, a.serverNow(ctx))
		}),
	}
	cmd.Flags().BoolVar(&raw, "raw", false, "write the body's raw bytes to stdout, and nothing else")
	return cmd
}

func (a *app) printJob(j *delayqueue.Job, now time.Time) error {
	name, at := when(j)
	t := newTable(a.stdout)
	t.row("ID", escape(j.ID, 200))
	t.row("Topic", escape(j.Topic, 200))
	t.row("State", j.State.String())
	t.row(strings.ToUpper(name[:1])+name[1:], relative(at, now))
	t.row("Attempts", fmt.Sprintf("%d of %d", j.Attempts, j.MaxAttempts))
	t.row("TTR", j.TTR.String())
	t.row("Last error", orDash(escape(j.LastError, 1000)))
	keys := make([]string, 0, len(j.Headers))
	for k := range j.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.row("Header "+escape(k, 100), escape(j.Headers[k], 1000))
	}
	t.row("Body", fmt.Sprintf("%d bytes", len(j.Body)))
	if err := t.flush(); err != nil {
		return err
	}
	if len(j.Body) == 0 {
		return nil
	}
	body := string(j.Body)
	if !printable(j.Body) {
		body = hex.Dump(j.Body)
	}
	_, err := fmt.Fprintln(a.stdout, strings.TrimSuffix(body, "\n"))
	return err
}

func (a *app) pushCommand() *cobra.Command {
	var (
		job     delayqueue.Job
		body    string
		at      string
		headers []string
	)
	cmd := &cobra.Command{
		Use:   "push <topic>",
		Short: "Push a job and print its ID",
		Long: `Push a job and print its ID, and nothing else, so that a script can keep it
(with --json: {"id": ..., "existed": ...}). The body is --body's text, or
with --body @file a file's bytes, or with --body @- stdin's. The job is due
after --delay, or at --at, or now. Pushing an --id that exists creates
nothing and prints that ID. Unlike the other commands, push creates the
queue when it does not exist.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if job.Body, err = a.readBody(body); err != nil {
				return err
			}
			if at != "" {
				if cmd.Flags().Changed("delay") {
					return usagef("--delay and --at exclude each other")
				}
				if job.RunAt, err = time.Parse(time.RFC3339Nano, at); err != nil {
					return usagef("--at: want an RFC 3339 time such as 2030-01-02T15:04:05Z: %v", err)
				}
			}
			if job.Headers, err = parseHeaders(headers); err != nil {
				return err
			}
			job.Topic = args[0]
			q, err := a.queue(cmd.Context(), true)
			if err != nil {
				return err
			}
			results, err := q.PushMany(cmd.Context(), []*delayqueue.Job{&job})
			if err != nil {
				return err
			}
			res := results[0]
			if a.json {
				return printJSON(a.stdout, map[string]any{"id": res.ID, "existed": res.Existed})
			}
			_, err = fmt.Fprintln(a.stdout, res.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&body, "body", "", "the body: `text`, @file, or @- for stdin")
	f.DurationVar(&job.Delay, "delay", 0, "due after this `duration`, such as 30s or 2h")
	f.StringVar(&at, "at", "", "due at this RFC 3339 `time`")
	f.StringVar(&job.ID, "id", "", "the job's ID (default: a generated one)")
	f.DurationVar(&job.TTR, "ttr", 0, "time to run once popped (default: 30s, the library's; dqctl does not know the workers' options)")
	f.IntVar(&job.MaxAttempts, "max-attempts", 0, "deliveries before it goes dead (default: 10, the library's)")
	f.StringArrayVar(&headers, "header", nil, "a header, `key=value` (the value as given, commas and quotes too); repeat for more")
	return cmd
}

// readBody reads --body: text, @file or @- (stdin).
func (a *app) readBody(arg string) ([]byte, error) {
	name, ok := strings.CutPrefix(arg, "@")
	switch {
	case !ok:
		return []byte(arg), nil
	case name == "-":
		return io.ReadAll(a.stdin)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, usagef("--body: %v", err)
	}
	return b, nil
}

func (a *app) removeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "remove <id>",
		Short: "Remove a job in any state (asks first)",
		Long: `Remove a job in any state: it will not be delivered (again). A consumer that
holds it is not stopped; its Finish, Retry or Touch fails. Asks for
confirmation unless --yes.`,
		Args: exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			j, err := q.Get(ctx, args[0])
			if err != nil {
				return err
			}
			if err := a.confirm(ctx, fmt.Sprintf("Remove %s job %q of topic %q?", j.State, j.ID, j.Topic)); err != nil {
				return err
			}
			if err := q.Remove(ctx, j.ID); err != nil {
				return err
			}
			return a.done(map[string]any{"removed": j.ID}, "removed %s", escape(j.ID, 200))
		}),
	}
	a.addYes(cmd)
	return cmd
}

// done reports what a command did: v with --json, else a line of text.
func (a *app) done(v any, format string, args ...any) error {
	if a.json {
		return printJSON(a.stdout, v)
	}
	_, err := fmt.Fprintf(a.stdout, format+"\n", args...)
	return err
}

// onQueue is a command's RunE that opens the queue, which must exist, and
// runs f on it.
func (a *app) onQueue(f func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		q, err := a.queue(cmd.Context(), false)
		if err != nil {
			return err
		}
		return f(cmd.Context(), q, args)
	}
}

// exactArgs is cobra.ExactArgs naming what is missing.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s: want %d argument(s), got %d: %s", cmd.Name(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}

// parseHeaders reads --header values, key=value each, split at the first
// "=": the value is kept as given.
func parseHeaders(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	h := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--header %q: want key=value", kv)
		}
		h[k] = v
	}
	return h, nil
}
