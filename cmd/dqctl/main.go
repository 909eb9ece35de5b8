// Command dqctl looks inside a delay queue (github.com/dqueue/delayqueue)
// and operates it from a terminal or a script: counts per topic and state,
// listings, single jobs, push, remove, requeue, purge, pause, resume, and a
// live view of the counts' rates.
//
// dqctl never calls Start: it moves no job on its own and takes no bucket
// lease, so it can run beside the workers at any time. Run "dqctl --help"
// for the commands, the connection flags and the exit codes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/dqueue/delayqueue"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// The exit codes, as "dqctl --help" and docs/operations.md state them.
const (
	exitOK       = 0
	exitError    = 1 // anything else, such as Redis unreachable
	exitUsage    = 2 // bad flags or input, or a destructive command not confirmed
	exitNotFound = 3 // no such job, or no such queue
)

func main() {
	// stderr is for dqctl's errors: go-redis's notes on what it does
	// (which master the sentinels named, reconnections) stay out of it.
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// quiet is a go-redis logger that prints nothing; the errors that matter
// come back from the calls.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// app is one run of dqctl: its flags, its streams, and the queue once a
// command opened it.
type app struct {
	conn   connFlags
	json   bool
	yes    bool
	stdin  *os.File
	stdout io.Writer
	stderr io.Writer

	client redis.UniversalClient
	q      *delayqueue.DelayQueue
}

// run runs dqctl with args and returns its exit code.
func run(ctx context.Context, args []string, stdin *os.File, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Cobra checks flags and arguments before PersistentPreRunE: an error
	// before it is a usage error, whatever its text.
	validated := false
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		validated = true
		return nil
	}
	err := root.ExecuteContext(ctx)
	a.close()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "dqctl:", err)
	code := exitCode(err)
	if !validated {
		// Flags or arguments cobra refused: the help says what they are.
		code = exitUsage
		fmt.Fprintln(stderr, `Run "dqctl --help" for usage.`)
	}
	return code
}

// usageError is bad input that no retry mends.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef returns a usage error (exit code 2).
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// errNoQueue is returned when the queue named by --queue does not exist.
var errNoQueue = errors.New("no such queue")

// exitCode maps an error to the exit code that a script can test.
func exitCode(err error) int {
	var usage usageError
	switch {
	case errors.Is(err, delayqueue.ErrNotFound), errors.Is(err, errNoQueue):
		return exitNotFound
	case errors.As(err, &usage),
		errors.Is(err, delayqueue.ErrInvalidJob),
		errors.Is(err, delayqueue.ErrInvalidTopic),
		errors.Is(err, delayqueue.ErrInvalidID),
		errors.Is(err, delayqueue.ErrInvalidState),
		errors.Is(err, delayqueue.ErrInvalidCursor),
		errors.Is(err, delayqueue.ErrInvalidLimit),
		errors.Is(err, delayqueue.ErrInvalidOption),
		errors.Is(err, delayqueue.ErrBodyTooLarge):
		return exitUsage
	}
	return exitError
}

const rootHelp = `dqctl looks inside a delay queue (github.com/dqueue/delayqueue) and operates it.

dqctl never starts the queue: it runs no bucket handler, moves no job on its
own and takes no bucket lease, so it is safe to run beside the workers.
Commands that only look refuse a queue that does not exist (exit code 3)
rather than create it; push creates it, as the library's New does.

Connection:
  --addr host:port                one server (default $DQ_ADDR, else 127.0.0.1:6379)
  --sentinel host:port,... --master name
                                  a primary found through Sentinel
  --cluster host:port,...         a Redis Cluster
  --queue name                    the queue (default $DQ_QUEUE, else "default")
  --user name                     a Redis ACL user (default $DQ_REDIS_USER)
The password is read from the environment variable DQ_REDIS_PASSWORD, or the
one --password-env names; DQ_SENTINEL_PASSWORD for the sentinels. No flag
takes a password, so none shows in the process list or the shell history.

Output is an aligned table, or with --json one JSON document (watch: one per
refresh). Times in JSON are RFC 3339 in UTC.

Destructive commands (remove, requeue --all, purge, functions --prune) ask
for confirmation on the terminal unless --yes is given; without --yes and
without a terminal on stdin they refuse.

Exit codes:
  0  success
  1  any other error, such as Redis unreachable
  2  usage error, bad input (state, duration, topic, ID, cursor, limit,
     a job not in the state the command needs), or a destructive command
     not confirmed
  3  not found: no such job, or no such queue`

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "dqctl",
		Short:         "Look inside a delay queue and operate it",
		Long:          rootHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	a.conn.register(root.PersistentFlags())
	root.PersistentFlags().BoolVar(&a.json, "json", false, "print JSON instead of a table")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		a.statsCommand(), a.topicsCommand(), a.watchCommand(),
		a.listCommand(), a.getCommand(), a.pushCommand(), a.removeCommand(),
		a.requeueCommand(), a.purgeCommand(), a.pauseCommand(), a.resumeCommand(), a.limitsCommand(),
		a.serveCommand(), a.schedulesCommand(), a.functionsCommand(),
	)
	return root
}

// addYes adds --yes to a destructive command.
func (a *app) addYes(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&a.yes, "yes", "y", false, "do it without asking")
}
