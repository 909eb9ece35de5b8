package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// DelayQueue is a delay queue on Redis. Producers Push jobs; bucket handlers
// started by Start move them to their topic's ready list when they are due;
// consumers Pop them and Finish them. A DelayQueue is safe for concurrent use;
// many processes may open the same queue on the same Redis.
type DelayQueue struct {
	client   redis.UniversalClient
	plain    bool   // the server cannot read a script's flags line (lua.go)
	ident    string // the queue's identity in Redis, which the jobs it pops carry
	instance int64  // this instance's number (ids.go)
	opts     options
	keys     keyspace
	pub      string // PUBLISH, or SPUBLISH on Redis Cluster
	ids      idGen
	rotor    atomic.Uint32             // where the next Pop starts looking
	pushes   batch.Lanes[*pushArgs]    // push.go
	calls    batch.Lanes[*scriptCall]  // scripts.go
	reserves batch.Lanes[*reserveCall] // ready.go
	finishes batch.Lanes[*finishCall]  // settle.go

	limiter   limiter                  // limits.go
	givebacks *batch.Lane[*giveBack]   // limits_grants.go
	handons   *batch.Lane[*handOnCall] // limits_handon.go

	held       heldSet    // reservations Pop returned, for Finish to check
	startWatch startWatch // warns when consumers wait and nobody started
	tally      doneTally  // what this process did, for the history (history.go)

	// Reserve calls: their names, how long their records live, and the
	// records' slots (see reserve.lua).
	reserveCalls atomic.Uint64
	callPrefix   string
	recordLife   time.Duration
	records      recordSlots
	readTimeout  time.Duration // the client's wait for a reply; 0 or less: none

	// How long Consume holds a finish, and a pop, for company
	// (settleWithin, gatherWithin; longer in tests).
	settleWithin, gatherWithin time.Duration

	// functions: the server runs functions (functions.go); functionsOff:
	// until when (Unix ns) the scripts run by SHA all the same.
	functions    atomic.Bool
	functionsOff atomic.Int64

	closed atomic.Bool
	done   chan struct{} // closed by Close: ends waiting Pops, and Consumes
	// consumes counts the Consumes that run; Close waits for them. One is
	// counted under mu, and only while the queue is open.
	consumes sync.WaitGroup

	mu       sync.Mutex // guards the fields below; never held across a round trip
	started  bool
	cancel   context.CancelFunc // ends the bucket handlers
	handlers []*bucketHandler
	stopped  chan struct{} // closed when every bucket handler has returned
	notes    *notifier
	waits    *waits // consumers waiting for ready jobs (wake_signals.go)
	// blocking is the client of the blocked calls (blocking.go); ownBlocking:
	// made by the queue, and closed by it.
	blocking    redis.UniversalClient
	ownBlocking bool

	restoreMu sync.Mutex // restoreRecord, one at a time

	closeOnce sync.Once
	shutdown  chan struct{} // closed when Close's shutdown has ended
	closeErr  error         // what it returned
}

// initTimeout bounds the one round trip of New, which has no context.
const initTimeout = 10 * time.Second

// New opens the queue in Redis through client: a single server, a Sentinel
// failover client or a Cluster client, which the queue never closes. It
// records the bucket count and job encoding on first use and checks them
// after (ErrBucketMismatch, ErrFormatMismatch); bad options return
// ErrInvalidOption. New talks to Redis once, for at most 10 seconds, and
// starts no goroutine. Jobs pushed with a delay become ready only while some
// process has called Start.
func New(client redis.UniversalClient, opts ...Option) (*DelayQueue, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		opt.apply(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	q := &DelayQueue{
		client: client,
		pub:    "PUBLISH",
		done:   make(chan struct{}),

		callPrefix:  newToken()[:16] + ".",
		recordLife:  recordLife(client),
		readTimeout: readTimeout(client),

		settleWithin: settleWithin,
		gatherWithin: gatherWithin,
	}
	_, cluster := client.(*redis.ClusterClient)
	buckets, asStored := o.buckets, !o.set.buckets
	if asStored {
		// A new queue's buckets: on a Cluster they spread it over
		// masters; on one server each bucket only adds script calls
		// (a move per bucket and due time, a reserve per bucket).
		buckets = 1
		if cluster {
			buckets = 8
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), initTimeout)
	defer cancel()
	mode := "open"
	if o.noInstance {
		mode = "look"
	}
	rec, err := q.initQueue(ctx, o.name, mode, buckets, asStored, newToken()[:16], 0)
	if err != nil {
		return nil, fmt.Errorf("delayqueue: open queue %q: %w", o.name, err)
	}
	q.loadFunctions(ctx, o.logger)
	if o.noInstance && rec.buckets == 0 {
		return nil, fmt.Errorf("%w: no queue %q on this Redis", ErrNotFound, o.name)
	}
	if rec.buckets != buckets && !asStored {
		return nil, fmt.Errorf("%w: queue %q has %d buckets, WithBuckets asks for %d", ErrBucketMismatch, o.name, rec.buckets, buckets)
	}
	if rec.buckets < 1 || rec.buckets > 4096 {
		return nil, fmt.Errorf("delayqueue: open queue %q: stored bucket count %d", o.name, rec.buckets)
	}
	q.ident, o.ident = rec.ident, rec.ident
	o.buckets = rec.buckets
	q.opts, q.keys = o, newKeyspace(o.name, o.buckets)
	lanes := 1
	if cluster {
		q.pub = "SPUBLISH"
		lanes = o.buckets
	}
	// Concurrent calls go together (internal/batch): one lane on a
	// single server, one per bucket on a Cluster, so that a stalled node
	// holds up only the calls to its own buckets. Each component sets up
	// its own lanes, beside the flush that sends their batches.
	q.pushes, q.calls = q.pushLanes(lanes), q.callLanes(lanes)
	q.reserves, q.finishes = q.reserveLanes(lanes), q.finishLanes(lanes)
	q.givebacks, q.handons = q.giveBackLane(), q.handOnLane()
	if rec.format != queueFormat {
		return nil, fmt.Errorf("%w: queue %q was written in format %d, this version writes %d", ErrFormatMismatch, o.name, rec.format, queueFormat)
	}
	if o.noInstance {
		return q, nil // generates no IDs
	}
	if rec.instance < 1 {
		return nil, fmt.Errorf("delayqueue: open queue %q: instance number %d", o.name, rec.instance)
	}
	q.instance = rec.instance
	q.ids.prefix.Store(instancePrefix(rec.instance)) // see ids.go
	return q, nil
}

// queueRecord is the queue's record in Redis, as init.lua answers.
type queueRecord struct {
	buckets  int
	instance int64
	format   int64
	ident    string
	restored bool
}

// initQueue runs init.lua on the queue's meta hash (see its header for the
// modes). The first call finds out whether the server reads the scripts'
// flags lines; miniredis does not, and gets the plain scripts from then on.
func (q *DelayQueue) initQueue(ctx context.Context, name, mode string, buckets int, asStored bool, ident string, instance int64) (queueRecord, error) {
	keys := []string{metaKey(name)}
	args := []any{buckets, queueFormat, asStored, mode, ident, instance}
	reply, err := q.runScript(ctx, scriptInit, keys, args...).Slice()
	if isCompileError(err) && !q.plain {
		q.plain = true
		reply, err = q.runScript(ctx, scriptInit, keys, args...).Slice()
	}
	if err != nil {
		return queueRecord{}, redisError(err)
	}
	var rec queueRecord
	var n [4]int64
	ok := len(reply) == 5
	for i, at := range []int{0, 1, 2, 4} {
		if ok {
			n[i], ok = reply[at].(int64)
		}
	}
	if ok {
		rec.ident, ok = reply[3].(string)
	}
	if !ok {
		return queueRecord{}, fmt.Errorf("unexpected reply %v", reply)
	}
	rec.buckets, rec.instance, rec.format, rec.restored = int(n[0]), n[1], n[2], n[3] == 1
	return rec, nil
}

// waiting returns the queue's waits (wake_signals.go), made on first use with
// the notifier, which carries resumes to them; ErrClosed after Close.
func (q *DelayQueue) waiting() (*waits, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return nil, ErrClosed
	}
	if q.waits == nil {
		q.notifierLocked(context.Background())
		q.waits = newWaits(q)
	}
	return q.waits, nil
}

// jobsWait reports whether jobs of topic are known to wait for this
// process's consumers (waits.jobsWait).
func (q *DelayQueue) jobsWait(topic string) bool {
	q.mu.Lock()
	w := q.waits
	q.mu.Unlock()
	return w != nil && w.jobsWait(topic)
}

// restoreRecord puts the queue's record (meta hash) back when Redis lost
// it, as this process knows it: the bucket count, the format, the identity,
// and an instance counter no lower than this instance's number, so that
// processes that open the queue later find it as it was. The bucket
// handlers call it when they suspect a loss; a call while another runs
// leaves the work to that one. It logs what it finds.
func (q *DelayQueue) restoreRecord(ctx context.Context) {
	if !q.restoreMu.TryLock() {
		return
	}
	defer q.restoreMu.Unlock()
	rec, err := q.initQueue(ctx, q.opts.name, "restore", q.opts.buckets, false, q.ident, q.instance)
	log := q.opts.logger
	switch {
	case err != nil:
		log.Warn("delayqueue: cannot check the queue's record in Redis", attrError, err)
	case rec.restored:
		log.Warn("delayqueue: the queue's record was gone from Redis (did Redis lose its data?); put it back",
			"queue", q.opts.name, "buckets", q.opts.buckets)
	case rec.buckets != q.opts.buckets || rec.format != queueFormat || rec.ident != q.ident:
		log.Error("delayqueue: the queue's record in Redis disagrees with this process; was it opened anew after Redis lost its data?",
			"queue", q.opts.name, "buckets", rec.buckets, "own_buckets", q.opts.buckets, "format", rec.format)
	}
}

// Start runs one bucket handler goroutine per bucket, which moves due jobs to
// their ready lists while it holds the bucket's lease. Some process must Start
// for delayed jobs to become ready; any number may. ctx bounds the start-up
// only; the bucket handlers run until Close, and keep trying while Redis is
// unreachable. Start logs a warning when Redis may evict keys. It returns
// ErrStarted when called twice and ErrClosed after Close.
func (q *DelayQueue) Start(ctx context.Context) error {
	if ctx == nil {
		panic("delayqueue: Start with a nil Context")
	}
	if err := q.startHandlers(ctx); err != nil {
		return err
	}
	// No lock is held from here on, as this talks to Redis. The bucket
	// handlers look at their buckets at once, and listen for wake-ups once
	// they hold or stand by for a lease: the confirmation of a wake-up
	// channel makes them look again, so a push in between is not missed.
	q.warnEviction(ctx)
	return nil
}

// startHandlers starts the bucket handlers, under q.mu, and the notifier
// that wakes them.
func (q *DelayQueue) startHandlers(ctx context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed.Load(): // Close sets it before it reads the fields below
		return ErrClosed
	case q.started:
		return ErrStarted
	}
	handlers := make([]*bucketHandler, q.opts.buckets)
	for b := range handlers {
		handlers[b] = newBucketHandler(q, b)
	}
	q.notifierLocked(ctx)
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, h := range handlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.run(hctx)
		}()
	}
	q.startHistory(hctx, &wg)
	stopped := make(chan struct{})
	go func() {
		wg.Wait()
		close(stopped)
	}()
	q.started, q.cancel, q.handlers, q.stopped = true, cancel, handlers, stopped
	return nil
}

// untilClosed returns a context that ends with ctx, or when the queue is
// closed.
func (q *DelayQueue) untilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-q.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// closeTimeout bounds the work Close does in Redis: releasing the leases.
const closeTimeout = 10 * time.Second

// Close stops the bucket handlers, releases their leases so that other processes
// take the buckets over at once, and ends waiting Pops with ErrClosed. Running
// Consumes take no more jobs: their handlers get Grace to return, then their jobs
// go back to ready, and they return ErrClosed. Unlike after the end of Consume's
// ctx, the handlers' own calls of the queue (a Push of a follow-up job, say) then
// return ErrClosed: to drain handlers that use the queue, end Consume's ctx
// first. Close waits for every goroutine of the queue, those Consumes and their
// handlers included, or returns ctx.Err() when ctx ends first; the shutdown then
// goes on (its work in Redis for at most 10 seconds). A handler that ignores its
// ctx past Grace holds Close until it returns: give Close a ctx with a deadline.
// A handler that calls Close waits for itself: call it from elsewhere. Jobs stay
// in Redis. Calling Close again waits for the same shutdown and returns what it
// returned.
func (q *DelayQueue) Close(ctx context.Context) error {
	if ctx == nil {
		panic("delayqueue: Close with a nil Context")
	}
	q.closeOnce.Do(func() {
		q.closed.Store(true)
		close(q.done)
		q.mu.Lock()
		cancel, stopped, handlers, notes, waits := q.cancel, q.stopped, q.handlers, q.notes, q.waits
		q.mu.Unlock()
		q.shutdown = make(chan struct{})
		sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		go func() {
			defer close(q.shutdown)
			defer stop()
			q.closeErr = q.stop(sctx, cancel, stopped, handlers, notes, waits)
			q.consumes.Wait()
		}()
	})
	select {
	case <-q.shutdown:
		return q.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop is the shutdown of Close. The blocked calls end first (they are
// poked, which ends them without losing a signal they took), then the
// bucket handlers; the records of reserve calls are deleted, and the
// blocked calls' client is closed. The notifier is closed whatever happens to the rest: its
// goroutines end with Close.
func (q *DelayQueue) stop(ctx context.Context, cancel context.CancelFunc, stopped chan struct{}, handlers []*bucketHandler, notes *notifier, waits *waits) error {
	var err error
	if waits != nil {
		err = waits.close(ctx)
	}
	err = errors.Join(err, q.stopHandlers(ctx, cancel, stopped, handlers), q.dropRecords(ctx))
	if notes != nil {
		// Closing it is local: a short bound of its own, should the
		// bucket handlers have used up ctx.
		nctx, stop := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer stop()
		err = errors.Join(err, notes.close(nctx))
	}
	return errors.Join(err, q.closeBlocker())
}

// stopHandlers ends the bucket handlers and releases their leases.
func (q *DelayQueue) stopHandlers(ctx context.Context, cancel context.CancelFunc, stopped chan struct{}, handlers []*bucketHandler) error {
	if cancel == nil {
		return nil // never started
	}
	cancel()
	select {
	case <-stopped:
	case <-ctx.Done():
		// A bucket handler is stuck in a call that its client's timeouts will
		// end; its lease runs out on its own.
		return ctx.Err()
	}
	var errs []error
	for _, h := range handlers {
		if err := h.release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// warnEviction logs a warning for every Redis master whose maxmemory-policy
// lets it evict keys: a job evicted that way is lost without a trace. A
// server that refuses CONFIG (as managed services may) is only noted at
// debug level.
func (q *DelayQueue) warnEviction(ctx context.Context) {
	check := func(ctx context.Context, c redis.Cmdable, addr string) {
		cfg, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			q.opts.logger.Debug("delayqueue: cannot read maxmemory-policy", "addr", addr, attrError, err)
			return
		}
		if p, ok := cfg["maxmemory-policy"]; ok && p != "noeviction" {
			q.opts.logger.Warn("delayqueue: Redis may evict keys, and jobs with them; set maxmemory-policy to noeviction",
				"addr", addr, "maxmemory-policy", p)
		}
	}
	if cc, ok := q.client.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			check(ctx, c, c.Options().Addr)
			return nil
		})
		return
	}
	check(ctx, q.client, "")
}
