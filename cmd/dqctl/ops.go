package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dqueue/delayqueue"
	"github.com/spf13/cobra"
)

// The commands on dead letters and topics: requeue, purge, pause, resume;
// and the confirmation that destructive commands ask for.

func (a *app) requeueCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "requeue <id> | --all <topic>",
		Short: "Make a dead job, or all of a topic's, ready again",
		Long: `Make a dead job ready again at once, with its attempts reset; with --all,
every dead job of a topic (asks first unless --yes).`,
		Args: exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			if !all {
				if err := q.RequeueDead(ctx, args[0]); err != nil {
					if !errors.Is(err, delayqueue.ErrNotFound) {
						return err
					}
					// Not dead: say what it is, when it is there at all.
					if j, gerr := q.Get(ctx, args[0]); gerr == nil {
						return usagef("job %s is %s, not dead; nothing was changed", escape(j.ID, 200), j.State)
					}
					return err
				}
				return a.done(map[string]any{"requeued": args[0]}, "requeued %s", escape(args[0], 200))
			}
			return a.allDead(ctx, q, args[0], "Requeue the %d dead jobs of topic %q?", "requeued", q.RequeueAllDead)
		}),
	}
	cmd.Flags().BoolVar(&all, "all", false, "requeue every dead job of the topic given")
	a.addYes(cmd)
	return cmd
}

func (a *app) purgeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "purge <topic>",
		Short: "Delete every dead job of a topic (asks first)",
		Args:  exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			return a.allDead(ctx, q, args[0], "Delete the %d dead jobs of topic %q for good?", "purged", q.PurgeDead)
		}),
	}
	a.addYes(cmd)
	return cmd
}

func (a *app) pauseCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "pause <topic>",
		Short: "Stop delivering a topic's jobs, in every process",
		Long: `Stop delivering a topic's jobs, in every process, within a second. Due jobs
still become ready; reserved jobs are not affected. Pausing a paused topic
changes nothing.`,
		Args: exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			if err := q.Pause(ctx, args[0]); err != nil {
				return err
			}
			return a.done(map[string]any{"topic": args[0], "paused": true}, "paused %s", args[0])
		}),
	}
}

func (a *app) resumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "resume <topic>",
		Short: "Deliver a paused topic's jobs again",
		Args:  exactArgs(1),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, args []string) error {
			if err := q.Resume(ctx, args[0]); err != nil {
				return err
			}
			return a.done(map[string]any{"topic": args[0], "paused": false}, "resumed %s", args[0])
		}),
	}
}

func (a *app) functionsCommand() *cobra.Command {
	var prune bool
	cmd := &cobra.Command{
		Use:   "functions [--prune]",
		Short: "List the function libraries other versions left in Redis; --prune deletes them",
		Long: `List the Redis function libraries (dq_<sha1>) of other versions of the
queue's package: each version whose scripts changed left its own, which
Redis keeps in memory and in its RDB and AOF files. With --prune, delete
them (asks first unless --yes). They are the server's, shared by every
queue on it. A process that still runs such a version loads its library
again on its next call: pruning costs it a load, not a failed call.`,
		Args: exactArgs(0),
		RunE: a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, _ []string) error {
			stale, err := q.StaleFunctions(ctx)
			if err != nil {
				return err
			}
			if !prune || len(stale) == 0 {
				if a.json {
					return printJSON(a.stdout, map[string]any{"stale": stale})
				}
				for _, name := range stale {
					fmt.Fprintln(a.stdout, name)
				}
				return a.done(nil, "%d libraries of other versions", len(stale))
			}
			if err := a.confirm(ctx, fmt.Sprintf("Delete the %d function libraries of other versions?", len(stale))); err != nil {
				return err
			}
			deleted, err := q.PruneFunctions(ctx)
			if err != nil {
				return err
			}
			return a.done(map[string]any{"deleted": deleted}, "deleted %d libraries of other versions", len(deleted))
		}),
	}
	cmd.Flags().BoolVar(&prune, "prune", false, "delete them")
	a.addYes(cmd)
	return cmd
}

// allDead asks prompt (given the topic's dead count and the topic), then
// runs op on every dead job of topic and says how many it did, as verb.
func (a *app) allDead(ctx context.Context, q *delayqueue.DelayQueue, topic, prompt, verb string,
	op func(context.Context, string) (int, error)) error {
	c, err := q.Counts(ctx, topic)
	if err != nil {
		return err
	}
	if c.Dead == 0 {
		return a.done(map[string]any{"topic": topic, verb: 0}, "no dead jobs of %s", escape(topic, 200))
	}
	if err := a.confirm(ctx, fmt.Sprintf(prompt, c.Dead, topic)); err != nil {
		return err
	}
	n, err := op(ctx, topic)
	if err != nil {
		return err
	}
	return a.done(map[string]any{"topic": topic, verb: n}, "%s %d dead jobs of %s", verb, n, escape(topic, 200))
}

// confirm asks prompt on the terminal, unless --yes. Without a terminal on
// stdin it refuses rather than hang or go ahead: a script must say --yes.
func (a *app) confirm(ctx context.Context, prompt string) error {
	if a.yes {
		return nil
	}
	return ask(ctx, a.stdin, isTerminal(a.stdin), a.stderr, prompt)
}

// ask is confirm's dialogue: nil only for an answer of y or yes. Ctrl-C
// (ctx ending) while it waits is a no.
func ask(ctx context.Context, in io.Reader, terminal bool, out io.Writer, prompt string) error {
	if !terminal {
		return usagef("%s Not confirmed: stdin is not a terminal; pass --yes to go ahead", prompt)
	}
	fmt.Fprintf(out, "%s [y/N] ", prompt)
	// The read cannot be called off: on Ctrl-C it is left waiting, and
	// dqctl exits without it.
	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(in).ReadString('\n')
		answer <- line
	}()
	select {
	case line := <-answer:
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "y", "yes":
			return nil
		}
	case <-ctx.Done():
		fmt.Fprintln(out)
	}
	return usagef("not confirmed; nothing was changed")
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// asFile is w when it is a file, else nil (which is no terminal).
func asFile(w io.Writer) *os.File {
	f, _ := w.(*os.File)
	return f
}
