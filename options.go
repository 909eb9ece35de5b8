package delayqueue

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// Option configures a DelayQueue in New. Only this package creates options:
// use the With functions.
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	name        string
	buckets     int
	ttr         time.Duration
	maxAttempts int
	maxBody     int
	lease       time.Duration
	batch       int
	poll        time.Duration
	backoff     Backoff
	retention   time.Duration
	dedup       time.Duration
	history     time.Duration
	logger      *slog.Logger
	set         struct{ buckets bool } // options given, where unset means "as stored"
	ident       string                 // the queue's identity in Redis, once opened: the maker of its generated IDs

	// Hooks of other packages: observe.go, middleware.go.
	observer          Observer
	noInstance        bool // WithoutInstance
	pushMiddleware    []PushMiddleware
	consumeMiddleware []Middleware
}

func defaultOptions() options {
	return options{
		name:        "default",
		buckets:     0, // the stored count, or a default by the kind of client (see WithBuckets)
		ttr:         30 * time.Second,
		maxAttempts: 10,
		maxBody:     1 << 20,
		lease:       30 * time.Second,
		batch:       200,
		poll:        10 * time.Second,
		history:     10 * time.Second,
		backoff:     ExponentialBackoff(time.Second, time.Hour),
		logger:      slog.Default(),
	}
}

// WithName sets the queue's name, which prefixes all of its keys. Queues with
// different names on one Redis are independent. Default: "default".
// A name is 1 to 64 characters from A-Z, a-z, 0-9, '_', '-' and '.'.
func WithName(name string) Option { return optionFunc(func(o *options) { o.name = name }) }

// WithBuckets sets how many buckets (shards) the queue has. It is fixed for
// the life of the queue's data: New fails with ErrBucketMismatch when it
// disagrees with the number stored in Redis. On Redis Cluster, more buckets
// spread one queue over more masters; on a single server (or Sentinel's
// master) they only split the work into more, smaller script calls, each
// with its own fixed cost. Default: the number the queue was created with;
// a new queue gets 8 on Redis Cluster and 1 elsewhere.
func WithBuckets(n int) Option {
	return optionFunc(func(o *options) { o.buckets, o.set.buckets = n, true })
}

// WithDefaultTTR sets the time-to-run of jobs pushed without one: how long a
// consumer may hold a popped job before it is delivered again. Default: 30s.
func WithDefaultTTR(d time.Duration) Option { return optionFunc(func(o *options) { o.ttr = d }) }

// WithMaxAttempts sets how many times a job pushed without its own
// MaxAttempts is delivered before it goes to the dead letters. Default: 10.
func WithMaxAttempts(n int) Option { return optionFunc(func(o *options) { o.maxAttempts = n }) }

// WithMaxBodySize sets the largest body Push accepts, in bytes, at most 16
// MiB. Redis copies a body at every step of its job: a 1 MiB body holds
// Redis for about 6 ms at its push and 4 ms at each delivery
// (docs/guarantees.md). Default: 1 MiB.
func WithMaxBodySize(n int) Option { return optionFunc(func(o *options) { o.maxBody = n }) }

// WithLease sets how long a bucket lease lasts without renewal. A bucket handler
// renews it every third of this; when a process dies, another takes its buckets
// over within one lease. Default: 30s.
func WithLease(d time.Duration) Option { return optionFunc(func(o *options) { o.lease = d }) }

// WithBatchSize sets how many due jobs one script call moves at most, which
// bounds how long a call holds Redis when a backlog drains. Default: 200,
// which keeps each call under about 4 ms with a million jobs waiting.
func WithBatchSize(n int) Option { return optionFunc(func(o *options) { o.batch = n }) }

// WithSafetyPoll sets how often an idle bucket handler looks at Redis without
// being woken, to cover a lost wake-up, and how often its pub/sub connections
// are pinged when silent. A pub/sub wake-up is lost only when the connection
// drops, and a reconnect triggers a fresh look too. The poll also bounds how
// long a ready job whose signal was lost with a process that took it (one
// that died, or froze) waits when no other call of its topic comes: the
// bucket's holder looks for such jobs once per poll, and its standby at
// its renewals past a poll (every third of the lease, WithLease)
// (docs/guarantees.md). Default: 10s.
func WithSafetyPoll(d time.Duration) Option { return optionFunc(func(o *options) { o.poll = d }) }

// WithBackoff sets how long a failed job waits before its next delivery:
// BackoffSchedule for an explicit list, ExponentialBackoff for doubling
// waits with jitter, or any func. Default: ExponentialBackoff(time.Second,
// time.Hour).
func WithBackoff(b Backoff) Option { return optionFunc(func(o *options) { o.backoff = b }) }

// WithDeadRetention makes the bucket handlers delete dead jobs that have been
// dead for longer than d; they look once per safety poll (WithSafetyPoll),
// and delete up to 10,000 per topic and bucket each time. Default: 0, dead
// jobs are kept until purged or requeued.
func WithDeadRetention(d time.Duration) Option {
	return optionFunc(func(o *options) { o.retention = d })
}

// WithDedupWindow sets the dedup window of jobs pushed with a caller-chosen
// ID and no window of their own (Job.DedupWindow): how long the ID stays
// taken after the job was finished, removed or purged, so that a producer
// that pushes it again after a lost reply creates nothing. Each such job
// leaves a tombstone of about 60 bytes for the window. The window is
// stored with each job, so it holds whichever process finishes or removes
// the job. At most 2^32-1 ms (49 days). Default: 0, none.
func WithDedupWindow(d time.Duration) Option { return optionFunc(func(o *options) { o.dedup = d }) }

// WithHistory sets how often the started processes sample the queue's
// figures into Redis, for History and the dashboard's charts: each series
// keeps its last 360 samples. Default: 10 s (an hour of history). 0 turns
// the sampling off in this process; else it must be at least 1 s.
func WithHistory(every time.Duration) Option {
	return optionFunc(func(o *options) { o.history = every })
}

// WithLogger sets the logger for the queue's errors and warnings.
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return optionFunc(func(o *options) { o.logger = l }) }

// maxMaxBody bounds WithMaxBodySize: a 16 MiB body holds Redis for about
// 200 ms at each step of its job.
const maxMaxBody = 16 << 20

var validName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// checkName returns ErrInvalidOption for a name no queue can have.
func checkName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("%w: name %q: want 1 to 64 of A-Z a-z 0-9 _ - .", ErrInvalidOption, name)
	}
	return nil
}

func (o *options) validate() error {
	if err := checkName(o.name); err != nil {
		return err
	}
	switch {
	case o.buckets < 0 || o.buckets > 4096 || o.set.buckets && o.buckets == 0:
		return fmt.Errorf("%w: buckets %d: want 1 to 4096", ErrInvalidOption, o.buckets)
	case o.ttr < time.Millisecond || o.ttr > maxTTR:
		return fmt.Errorf("%w: default TTR %v: want 1ms to %v", ErrInvalidOption, o.ttr, maxTTR)
	case o.maxAttempts < 1 || o.maxAttempts > maxMaxAttempts:
		return fmt.Errorf("%w: max attempts %d: want 1 to %d", ErrInvalidOption, o.maxAttempts, maxMaxAttempts)
	case o.maxBody < 1 || o.maxBody > maxMaxBody:
		return fmt.Errorf("%w: max body size %d: want 1 to %d", ErrInvalidOption, o.maxBody, maxMaxBody)
	case o.lease < 30*time.Millisecond:
		return fmt.Errorf("%w: lease %v: want at least 30ms", ErrInvalidOption, o.lease)
	case o.batch < 1 || o.batch > 5000:
		return fmt.Errorf("%w: batch size %d: want 1 to 5000", ErrInvalidOption, o.batch)
	case o.poll < time.Millisecond:
		return fmt.Errorf("%w: safety poll %v: want at least 1ms", ErrInvalidOption, o.poll)
	case o.backoff == nil:
		return fmt.Errorf("%w: nil backoff", ErrInvalidOption)
	case o.retention < 0:
		return fmt.Errorf("%w: negative dead-letter retention %v", ErrInvalidOption, o.retention)
	case o.dedup < 0 || o.dedup > maxDedupWindow:
		return fmt.Errorf("%w: dedup window %v: want 0 to %v", ErrInvalidOption, o.dedup, maxDedupWindow)
	case o.history != 0 && (o.history < time.Second || o.history%time.Millisecond != 0):
		return fmt.Errorf("%w: history interval %v: want 0, or whole milliseconds from 1s", ErrInvalidOption, o.history)
	case o.logger == nil:
		return fmt.Errorf("%w: nil logger", ErrInvalidOption)
	}
	return o.validateMiddleware()
}

// Log attribute keys.
const (
	attrBucket  = "bucket"
	attrTopic   = "topic"
	attrJobID   = "job_id"
	attrAttempt = "attempt"
	attrError   = "error"
)

// WithoutInstance opens an existing queue without writing to Redis: New
// neither creates the queue nor takes an instance number, as it otherwise
// does every time, for the job IDs it generates. Such a DelayQueue pushes
// only jobs that carry an ID of the caller's (ErrInvalidJob otherwise);
// everything else works. It is for tools that look at and operate a queue
// and open it often, as cmd/dqctl does. New returns ErrNotFound when the
// queue does not exist.
func WithoutInstance() Option {
	return optionFunc(func(o *options) { o.noInstance = true })
}
