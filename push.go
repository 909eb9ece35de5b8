package delayqueue

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
	"github.com/redis/go-redis/v9"
)

// Adding jobs to the buckets: Push, PushMany and Upsert; how a job is
// checked and encoded, coalesced with concurrent pushes, and sent as one
// push.lua call per bucket.

// Push adds a job, due after job.Delay on the Redis server's clock or at
// job.RunAt, and returns its ID: the job's own, else a new unique one that
// it also stores in job.ID. A job whose ID exists already is not pushed
// again, and Push returns its ID with no error. It returns an error matching
// ErrInvalidJob for a job it refuses, and ErrClosed after Close. It is safe
// for concurrent use; concurrent calls go to Redis together.
func (q *DelayQueue) Push(ctx context.Context, job *Job) (string, error) {
	if q.closed.Load() {
		return "", ErrClosed
	}
	a, err := q.opts.prepare(job)
	if err != nil {
		return "", err
	}
	res, err := q.pushPrepared(ctx, job, a)
	return res.ID, err
}

// PushResult is what a push did with one job.
type PushResult struct {
	ID string
	// Existed is set when a job with this ID existed already, or the ID was
	// still taken by its dedup window: nothing changed, neither body nor
	// due time. A job pushed again under the ID that the queue generated
	// for it is the same job pushed twice, and does not set it.
	Existed bool
}

// pushPrepared pushes a job that prepare checked and encoded as a, through
// the push middleware.
func (q *DelayQueue) pushPrepared(ctx context.Context, job *Job, a pushArgs) (PushResult, error) {
	if q.opts.pushMiddleware == nil {
		return q.pushOne(ctx, job, a)
	}
	return q.throughPushOne(ctx, job, q.pushOne)
}

// pushOne pushes a job that prepare checked and encoded as a.
func (q *DelayQueue) pushOne(ctx context.Context, job *Job, a pushArgs) (PushResult, error) {
	for renewals := 0; ; renewals++ {
		q.assignID(job, &a, q.idEpoch())
		// Concurrent Push calls share round trips and script calls.
		if err := q.pushes.For(a.bucket).Do(ctx, &a); err != nil {
			return PushResult{}, err
		}
		if a.status != pushTaken {
			res := PushResult{ID: job.ID, Existed: a.status == pushExisted}
			q.observe(ctx, Event{Kind: EventPushed, Topic: job.Topic, JobID: job.ID, Existed: res.Existed})
			return res, nil
		}
		if err := q.idTaken(ctx, job.ID, renewals); err != nil {
			return PushResult{}, err
		}
		job.ID = "" // a new one, then
	}
}

// maxPushChunk bounds how many jobs one push script call carries, and
// maxPushBytes how many bytes of encoded jobs (but for one larger job): a
// script holds Redis for about 6 ms per MiB of bodies it stores.
const (
	maxPushChunk = 1000
	maxPushBytes = 1 << 20
)

// PushMany adds jobs with one script call per bucket they fall in (per
// 1,000 jobs), in one pipeline, and returns each job's PushResult, in
// order. It checks every job first: when one is refused (ErrInvalidJob),
// nothing is pushed. Jobs without an ID get one, stored in their ID field,
// so that PushMany again with the same jobs after an error pushes none of
// them twice. Jobs whose ID exists already are left alone, as in Push. One
// job goes together with concurrent Push calls, as a Push does.
func (q *DelayQueue) PushMany(ctx context.Context, jobs []*Job) ([]PushResult, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	args, err := q.opts.prepareAll(jobs)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 1 {
		res, err := q.pushPrepared(ctx, jobs[0], args[0])
		if err != nil {
			return nil, err
		}
		return []PushResult{res}, nil
	}
	if q.opts.pushMiddleware == nil {
		return q.pushMany(ctx, jobs, args)
	}
	return q.throughPushMany(ctx, jobs)
}

// prepareAll prepares every job, or says which one it refuses.
func (o *options) prepareAll(jobs []*Job) ([]pushArgs, error) {
	args := make([]pushArgs, len(jobs))
	for i, job := range jobs {
		a, err := o.prepare(job)
		if err != nil {
			return nil, fmt.Errorf("job %d: %w", i, err)
		}
		args[i] = a
	}
	return args, nil
}

// pushMany pushes jobs that prepareAll checked and encoded as args.
func (q *DelayQueue) pushMany(ctx context.Context, jobs []*Job, args []pushArgs) ([]PushResult, error) {
	epoch := q.idEpoch() // the call's jobs together, as far as runs allow
	for i, job := range jobs {
		q.assignID(job, &args[i], epoch)
	}
	pending := make([]*pushArgs, len(args))
	for i := range args {
		pending[i] = &args[i]
	}
	for renewals := 0; ; renewals++ {
		if errs := q.pushBuckets(ctx, pending); errs != nil {
			for _, a := range pending {
				if err := errs[a.bucket]; err != nil {
					return nil, err
				}
			}
		}
		// Jobs whose generated ID was taken go again under a new one.
		pending = pending[:0]
		for i := range args {
			if a := &args[i]; a.status == pushTaken {
				if err := q.idTaken(ctx, a.id, renewals); err != nil {
					return nil, err
				}
				jobs[i].ID = "" // a new one, then
				q.assignID(jobs[i], a, q.idEpoch())
				pending = append(pending, a)
			}
		}
		if len(pending) == 0 {
			res := make([]PushResult, len(args))
			for i, a := range args {
				res[i] = PushResult{ID: a.id, Existed: a.status == pushExisted}
				q.observe(ctx, Event{Kind: EventPushed, Topic: jobs[i].Topic, JobID: a.id, Existed: res[i].Existed})
			}
			return res, nil
		}
	}
}

// Upsert creates job, or replaces the job with its ID in any state, in one
// script, as if pushed anew (attempts and last error start over). job must
// carry an ID of the caller's (ErrInvalidJob otherwise). A replaced
// reserved job's consumer gets ErrReservationLost from Finish, Retry and
// Touch. Existed is set when a job was replaced.
func (q *DelayQueue) Upsert(ctx context.Context, job *Job) (PushResult, error) {
	if q.closed.Load() {
		return PushResult{}, ErrClosed
	}
	if job != nil && (job.ID == "" || generated(job.ID)) {
		return PushResult{}, fmt.Errorf("%w: Upsert needs an ID of the caller's", ErrInvalidJob)
	}
	a, err := q.opts.prepare(job)
	if err != nil {
		return PushResult{}, err
	}
	if q.opts.pushMiddleware == nil {
		return q.upsert(ctx, job, a)
	}
	return q.throughPushOne(ctx, job, q.upsert)
}

// upsert creates or replaces a job that prepare checked and encoded as a.
func (q *DelayQueue) upsert(ctx context.Context, job *Job, a pushArgs) (PushResult, error) {
	b := bucketOf(job.ID, q.opts.buckets)
	bk := q.keys.bucket(b)
	res, err := q.run(ctx, b, scriptUpsert, []string{bk.pool, bk.zset, bk.readyPrefix, bk.dedup, bk.counts, bk.sigPrefix,
		bk.deadPrefix, bk.deadTopics, bk.grants}, bk.wake, q.pub, job.ID, a.delayMs, a.job).Slice()
	status, err := q.endedReservation(ctx, res, err)
	if err != nil {
		return PushResult{}, fmt.Errorf("delayqueue: upsert %q: %w", job.ID, err)
	}
	q.observe(ctx, Event{Kind: EventPushed, Topic: job.Topic, JobID: job.ID, Existed: status == upsertReplaced})
	return PushResult{ID: job.ID, Existed: status == upsertReplaced}, nil
}

// pushArgs are the validated values of one job for push.lua, and its
// outcome.
type pushArgs struct {
	id     string
	bucket int
	// delayMs is the delay on the server's clock, or "" when the encoded
	// job's at_ms holds an absolute due time.
	delayMs string
	// job is the job encoded as delayed (see encodeJob).
	job []byte
	// generated is set when the queue made the ID: it must not exist
	// already, unless as this very job (a push re-sent by go-redis).
	generated bool
	// status is push.lua's answer for the job.
	status int64
}

// prepare checks a job against the queue's limits and fills in defaults. It
// returns errors matching ErrInvalidJob.
func (o *options) prepare(job *Job) (pushArgs, error) {
	if job == nil {
		return pushArgs{}, fmt.Errorf("%w: nil", ErrInvalidJob)
	}
	if err := validateTopic(job.Topic); err != nil {
		return pushArgs{}, within(ErrInvalidJob, err)
	}
	if job.ID == "" && o.noInstance {
		return pushArgs{}, fmt.Errorf("%w: no ID, and a queue opened WithoutInstance generates none", ErrInvalidJob)
	}
	if job.ID != "" {
		if err := validateID(job.ID); err != nil {
			return pushArgs{}, within(ErrInvalidJob, err)
		}
		if generated(job.ID) && job.nonce == 0 {
			return pushArgs{}, within(ErrInvalidJob, fmt.Errorf("%w: %q: IDs that begin with %q are the queue's own; push the Job that Push gave it, or use an ID of your own",
				ErrInvalidID, job.ID, generatedMark))
		}
		if generated(job.ID) && job.madeBy != o.ident {
			return pushArgs{}, within(ErrInvalidJob, fmt.Errorf("%w: %q was generated by another queue; clear the ID to push the job as a new one",
				ErrInvalidID, job.ID))
		}
	}
	var a pushArgs
	switch {
	case len(job.Body) > o.maxBody:
		return a, within(ErrInvalidJob, fmt.Errorf("%w: %d bytes, limit %d", ErrBodyTooLarge, len(job.Body), o.maxBody))
	case job.Delay < 0:
		return a, fmt.Errorf("%w: negative delay %v", ErrInvalidJob, job.Delay)
	case job.Delay > 0 && !job.RunAt.IsZero():
		return a, fmt.Errorf("%w: both Delay and RunAt set", ErrInvalidJob)
	case job.TTR < 0:
		return a, fmt.Errorf("%w: negative TTR %v", ErrInvalidJob, job.TTR)
	case job.TTR > 0 && job.TTR < time.Millisecond:
		return a, fmt.Errorf("%w: TTR %v under 1ms", ErrInvalidJob, job.TTR)
	case job.TTR > maxTTR:
		return a, fmt.Errorf("%w: TTR %v over %v", ErrInvalidJob, job.TTR, maxTTR)
	case job.MaxAttempts < 0 || job.MaxAttempts > maxMaxAttempts:
		return a, fmt.Errorf("%w: MaxAttempts %d: want 0 to %d", ErrInvalidJob, job.MaxAttempts, maxMaxAttempts)
	case job.DedupWindow < 0 || job.DedupWindow > maxDedupWindow:
		return a, fmt.Errorf("%w: DedupWindow %v: want 0 to %v", ErrInvalidJob, job.DedupWindow, maxDedupWindow)
	}
	if err := validateHeaders(job.Headers); err != nil {
		return a, err
	}
	var atMs int64
	if job.RunAt.IsZero() {
		a.delayMs = strconv.FormatInt(ceilMs(job.Delay), 10)
	} else {
		var err error
		if atMs, err = runAtMs(job.RunAt); err != nil {
			return a, err
		}
	}
	ttr := job.TTR
	if ttr == 0 {
		ttr = o.ttr
	}
	maxAttempts := job.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = o.maxAttempts
	}
	a.generated = job.ID == "" || generated(job.ID)
	window := job.DedupWindow
	if window == 0 && !a.generated {
		window = o.dedup // a generated ID is never pushed again by a producer
	}
	if a.generated && job.nonce == 0 {
		job.nonce, job.madeBy = rand.Uint32()|1, o.ident
	}
	var nonce uint32
	if a.generated {
		nonce = job.nonce
	}
	a.id = job.ID
	a.job = encodeJob(job.Topic, job.Body, ceilMs(ttr), maxAttempts, atMs, ceilMs(window), nonce, encodeHeaders(job.Headers))
	return a, nil
}

// assignID gives a job without an ID a new one, in the bucket of epoch
// (idEpoch), and files it in its bucket.
func (q *DelayQueue) assignID(job *Job, a *pushArgs, epoch int64) {
	if job.ID == "" {
		job.ID = q.ids.nextIn(q.opts.buckets, epoch)
	}
	a.id, a.bucket, a.status = job.ID, bucketOf(job.ID, q.opts.buckets), 0
}

// idTaken handles a generated ID that push.lua found taken by another job:
// the queue takes a new instance number, unless it has done so too often.
func (q *DelayQueue) idTaken(ctx context.Context, id string, renewals int) error {
	if renewals >= maxIDRenewals {
		return fmt.Errorf("delayqueue: push: generated ID %q is taken by another job, even after %d new instance numbers", id, renewals)
	}
	return q.renewIDs(ctx, id)
}

// pushLanes coalesce concurrent pushes, keeping two batches in flight: with
// one, a lone producer's pushes wait for each round trip and it loses a
// fifth of its rate.
func (q *DelayQueue) pushLanes(n int) batch.Lanes[*pushArgs] {
	return batch.NewLanes(n, maxPushChunk, 2, q.flushPushes)
}

// flushPushes pushes a batch of concurrent Push calls, coalesced.
func (q *DelayQueue) flushPushes(ctx context.Context, reqs []*batch.Request[*pushArgs]) {
	errs := q.pushBuckets(ctx, batch.Inputs(reqs))
	for _, r := range reqs {
		r.Err = errs[r.In.bucket]
	}
}

// pushBuckets pushes jobs with one script call per bucket they fall in and
// chunk, all in one pipeline (one round trip per node), and sets each one's
// status. It returns the error of each bucket that failed; nil when all
// succeeded.
func (q *DelayQueue) pushBuckets(ctx context.Context, jobs []*pushArgs) map[int]error {
	chunks := byBucketSized(jobs, func(j *pushArgs) int { return j.bucket }, maxPushChunk,
		func(j *pushArgs) int { return len(j.job) }, maxPushBytes)
	calls := make([]*scriptCall, len(chunks))
	for i, chunk := range chunks {
		keys, args := q.pushCall(chunk[0].bucket, chunk)
		calls[i] = &scriptCall{script: scriptPush, keys: keys, args: args}
	}
	q.sendCalls(ctx, calls)
	var errs map[int]error
	for i, chunk := range chunks {
		b := chunk[0].bucket
		if err := pushResult(b, chunk, calls[i].cmd); err != nil {
			if errs == nil {
				errs = map[int]error{}
			}
			errs[b] = cmp.Or(errs[b], err)
		}
	}
	return errs
}

// pushCall builds the keys and arguments of push.lua for jobs of bucket b.
func (q *DelayQueue) pushCall(b int, jobs []*pushArgs) ([]string, []any) {
	bk := q.keys.bucket(b)
	args := make([]any, 0, 2+4*len(jobs))
	args = append(args, bk.wake, q.pub)
	for _, j := range jobs {
		args = append(args, j.id, j.delayMs, j.job, j.generated)
	}
	return []string{bk.pool, bk.zset, bk.readyPrefix, bk.dedup, bk.counts, bk.sigPrefix}, args
}

// pushResult reads push.lua's reply into the jobs' statuses.
func pushResult(b int, jobs []*pushArgs, reply *redis.Cmd) error {
	res, err := reply.Int64Slice()
	if err != nil {
		return fmt.Errorf("delayqueue: push to bucket %d: %w", b, err)
	}
	if len(res) != len(jobs) {
		return fmt.Errorf("delayqueue: push to bucket %d: %d replies for %d jobs", b, len(res), len(jobs))
	}
	for i, r := range res {
		jobs[i].status = r
	}
	return nil
}
