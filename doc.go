// Package delayqueue is a delay queue on Redis: push a job to run after a
// delay or at a time; when it is due, a consumer pops it; the consumer
// finishes it, or it comes back.
//
//	q, err := delayqueue.New(client, delayqueue.WithName("orders"))
//	err = q.Start(ctx)                     // move due jobs, in every process that should
//	id, err := q.Push(ctx, &delayqueue.Job{Topic: "order.cancel", Body: b, Delay: 30 * time.Minute})
//	job, err := q.Pop(ctx, "order.cancel", time.Minute)
//	err = q.Finish(ctx, job.ID)
//
// # Guarantees
//
//   - At least once: a popped job that is not finished within its TTR
//     (time to run) is delivered again, with Attempts one higher, until
//     MaxAttempts; then it goes to its topic's dead letters.
//
//   - Never early: due times are whole milliseconds on the Redis server's
//     clock (TIME inside the scripts), so processes whose clocks disagree
//     still agree on when a job is due. Only Job.RunAt carries the caller's
//     clock.
//
//   - On time: the process that holds a bucket's lease sleeps until the
//     bucket's next job is due and is woken over pub/sub by a push of an
//     earlier one; consumers are woken when jobs become ready. When that
//     process dies, another takes the bucket over within one lease
//     (WithLease, default 30s); Close hands buckets over at once.
//
//   - Once per push: a job pushed with a caller-chosen ID exists once while
//     that ID exists, however often it is pushed, and for its dedup window
//     after it was finished or removed (Job.DedupWindow, WithDedupWindow).
//     A generated ID is unique among every process that ever opens the
//     queue, and Push returns it only once its job is stored under it.
//
//   - A stale consumer changes nothing: once a reservation ran out and the
//     job went to another consumer, the first one's Retry, Touch and
//     Release return ErrReservationLost, and so does Finish(ctx, id) when this
//     DelayQueue's Pop returned that reservation (see Finish for the other
//     cases). Consume extends the reservations of the jobs it runs, up to
//     ConsumeOptions.MaxRunTime.
//
//   - Every change of a job is one Lua script over the keys of one bucket:
//     atomic, safe to run twice (go-redis re-sends a command after a read
//     timeout), and never a CROSSSLOT error on Redis Cluster.
//
//   - Periodic schedules (Schedule) are data in Redis, fired by any started
//     process: each tick pushes one job, by a compare-and-set in the
//     schedule's bucket, ahead of its time. After an outage of every
//     process (none reached Redis for twice its lease), the ticks missed
//     give one job, then ticking resumes; a takeover pushes the ticks it
//     was late for, one job each.
//
// # Limits
//
// Jobs live in Redis and are as durable as Redis makes them. With RDB
// snapshots only, a crash loses what was written since the last snapshot;
// with appendonly yes and appendfsync everysec, up to about a second; with
// appendfsync always, nothing that Redis acknowledged. Replication is
// asynchronous, so a failover can lose the last writes to the old primary.
// Redis must not evict keys: Start warns unless maxmemory-policy is
// noeviction. Jobs pushed with a delay become ready only while some process
// has called Start. Finish(ctx, id) checks the reservation that this
// DelayQueue's Pop returned; for an ID it did not pop, it finishes whatever
// reservation the job has.
//
// # Layout in Redis
//
// A queue has a name and a fixed number of buckets (WithBuckets; by default
// 8 on Redis Cluster and 1 elsewhere), stored in Redis. A job's bucket
// follows from its ID alone. All keys of bucket b carry the hash tag
// {name:b} (or {name:b~k}, so that the buckets' slots spread evenly over the
// slot space), so one bucket lives in one Cluster slot and the buckets
// spread over the masters:
//
//	dq:{name:b}:pool           HASH    job ID -> encoded job
//	dq:{name:b}:bucket         ZSET    delayed jobs by due time, reserved jobs by reservation deadline (ms)
//	dq:{name:b}:ready:<topic>  LIST    IDs of ready jobs, oldest first
//	dq:{name:b}:dead:<topic>   ZSET    IDs of dead jobs by time of death
//	dq:{name:b}:lock           STRING  the lease: the token of the bucket handler that moves it
//	dq:{name:b}:deadtopics     SET     topics with dead letters
//	dq:{name:b}:leases         STRING  counter numbering the bucket's reservations
//	dq:{name:b}:rsv:<slot>     STRING  what a reserve call reserved, until the process's next call there writes over it
//	dq:{name:b}:dedup          ZSET    tombstones: IDs of finished or removed jobs, by end of window
//	dq:{name:b}:counts         HASH    how many jobs of each topic are delayed, ready, reserved
//	dq:{name:b}:schedules      HASH    schedule name -> definition (the schedules whose name falls in b)
//	dq:{name:b}:ticks          ZSET    schedule names by next tick (ms), whose job is pushed already
//	dq:{name:b}:lastticks      HASH    schedule name -> latest tick that came
//	dq:{name}:meta             HASH    bucket count, format, instance counter for IDs
//	dq:{name}:paused           SET     paused topics
//	dq:{name}:limits           HASH    topic -> its limits (SetLimits)
//	dq:{name}:lim:...          ZSETs and LISTs of each limited topic's grants (keys.go)
//	dq:{name}:hist:...         the last hour's samples (History): a LIST per topic and one for the queue
//
// A topic's limits live in the queue's own slot, not in the buckets': a
// consumer of a limited topic first takes grants there (no more than the
// limits leave, counted for every process), then reserves at most that many
// jobs from the buckets, wherever they are, and gives each grant back when
// its job is settled; a grant whose job's reservation ran out is dropped, so
// a process that dies gives its capacity back after the TTR. Under Consume,
// a job that finishes hands its grant on to the next job of the topic from
// its bucket, in the round trip of its finish (limits_handon.go).
//
// Wake-ups travel on the bucket's pub/sub channels dq:{name:b}:ev:wake and
// dq:{name:b}:ev:ready:<topic>, sharded (SPUBLISH) on Redis Cluster.
//
// # The code, in the order a job passes through it
//
//   - delayqueue.go: the facade. New opens the queue, Start runs the
//     bucket handlers, Close stops them.
//   - job.go: Job and State, and the checks a job must pass. codec.go:
//     the job encoding (the one table of it; scripts/lib/header.lua is its
//     one Lua writer). pool.go: the pool, each bucket's hash of jobs; Get
//     reads a job, Remove deletes it.
//   - push.go: Push and PushMany check, encode and group jobs by bucket;
//     concurrent pushes go together (internal/batch) into one push.lua
//     call per bucket; Upsert creates or replaces one job. A job due later
//     waits in its bucket's zset; one due now goes straight to its ready
//     list. ids.go makes the IDs of jobs pushed without one.
//   - bucket.go: moving due jobs out of a bucket (moveDue), and
//     RescheduleIn/RescheduleAt for a waiting job. handler.go: the bucket
//     handler, one per bucket and started process; it sleeps until the
//     next job is due, then moveDue (move.lua) moves due jobs, and jobs
//     whose reservation ran out, to their ready lists.
//   - lock.go: the bucket's lease, under which one bucket handler moves
//     it, and the standby that takes it over; lock_started.go warns when
//     consumers wait and no process holds a lease.
//   - wake_*.go: wake-ups. wake_notify.go routes pub/sub messages to
//     bucket handlers (a job became the earliest) and to waiting consumers
//     (jobs became ready); wake_pubsub.go and wake_pubsub_repair.go keep
//     its subscriptions; wake_signals.go is a process's waiting consumers,
//     and wake_signals_block.go the blocked calls that take ready signals
//     for them, one job waking one consumer.
//   - ready.go: Pop reserves ready jobs with reserve.lua, starting their
//     TTR; concurrent pops of one list share a call.
//   - consume.go: Consume pops for a pool of handlers; consume_run.go runs
//     each job's handler and settles the job by its outcome.
//   - settle*.go: settling a reserved job. settle.go: Finish deletes it,
//     Release gives it back; settle_retry.go: Retry and RetryAfter, with
//     backoff; settle_keep.go: Touch, and the extensions of running
//     handlers' reservations; settle_outcome.go: the errors with which a
//     handler asks for another outcome (ErrSkipRetry, RetryIn, Snooze);
//     settle_held.go: the reservations this instance popped, which Finish
//     checks.
//   - dead.go: jobs out of attempts: requeued, purged, expired.
//   - seeing inside: inspect.go reads the counts per topic and state that
//     every script keeps (Overview, Counts); list.go lists a topic's jobs
//     by state, a bounded step at a time (List), list_cursor.go encodes
//     where a listing goes on; pause.go pauses a topic; history.go keeps
//     the last hour's figures in Redis from started processes (History),
//     history_tally.go what each of them counts in memory meanwhile.
//   - limits*.go: a topic's limits (SetLimits); limits_grants.go takes and
//     gives back the grants, limits_handon.go hands a finished job's grant
//     on to the next job.
//   - schedule.go: periodic schedules (Schedule); schedule_tick.go fires
//     their ticks from the bucket handler.
//   - observe.go and middleware.go: the hooks of other packages (dqotel
//     for one): Observers receive every step; push middleware wraps every
//     push, and may set a job's Headers; consume middleware wraps every
//     Consume handler.
//   - lua.go loads scripts/*.lua, each with the scripts/lib/*.lua files
//     its include lines name; functions.go makes each a Redis function
//     and runs it, or by SHA where the server has no functions;
//     replies.go names the codes they answer with; scripts.go sends their
//     calls.
//   - keys.go (every key name, and the bucket of an ID), options.go and
//     errors.go serve all the above.
package delayqueue
