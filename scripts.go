package delayqueue

import (
	"context"
	"embed"
	"errors"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// The scripts, each job.lua's helpers followed by the script's own file.
// redis.Script runs them by SHA and loads them on NOSCRIPT.
var (
	scriptInit       = loadScript("init.lua")
	scriptPush       = loadScript("push.lua")
	scriptMove       = loadScript("move.lua")
	scriptReserve    = loadScript("reserve.lua")
	scriptFinish     = loadScript("finish.lua")
	scriptRemove     = loadScript("remove.lua")
	scriptUnlock     = loadScript("unlock.lua")
	scriptRetry      = loadScript("retry.lua")
	scriptTouch      = loadScript("touch.lua")
	scriptRelease    = loadScript("release.lua")
	scriptReschedule = loadScript("reschedule.lua")
	scriptDead       = loadScript("dead.lua")
	scriptRequeue    = loadScript("requeue.lua")
	scriptPurge      = loadScript("purge.lua")
)

func loadScript(name string) *redis.Script {
	prelude, err := scriptFiles.ReadFile("scripts/job.lua")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	src, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(prelude) + "\n" + string(src))
}

// scriptCall is one script call over the keys of one bucket.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd // the reply, once sent
}

// run runs a script by SHA over keys of bucket b. Concurrent calls share
// round trips: while one is in flight, the calls that follow wait and then
// go together in one pipeline (see coalescer).
func (q *DelayQueue) run(ctx context.Context, b int, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	c := &scriptCall{script: s, keys: keys, args: args}
	if err := lane(q.calls, b).do(ctx, c); c.cmd == nil {
		// ctx ended while the call waited its turn: it was never sent.
		c.cmd = redis.NewCmd(ctx)
		c.cmd.SetErr(err)
	}
	return c.cmd
}

// flushCalls sends a batch of coalesced script calls.
func (q *DelayQueue) flushCalls(ctx context.Context, batch []*request[*scriptCall]) {
	calls := make([]*scriptCall, len(batch))
	for i, r := range batch {
		calls[i] = r.in
	}
	q.sendCalls(ctx, calls)
	for _, r := range batch {
		r.err = r.in.cmd.Err()
	}
}

// sendCalls sends script calls, in one pipeline when there are several (one
// round trip per node), and sets each call's reply.
func (q *DelayQueue) sendCalls(ctx context.Context, calls []*scriptCall) {
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, q.client, c.keys, c.args...)
	} else {
		pipe := q.client.Pipeline()
		for _, c := range calls {
			c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are read per call below
		for _, c := range calls {
			if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
				// Not run: the server has not seen the script yet (or
				// restarted). Run loads it.
				c.cmd = c.script.Run(ctx, q.client, c.keys, c.args...)
			}
		}
	}
	for _, c := range calls {
		q.noteError(ctx, c.cmd.Err())
	}
}

// noteError asks a Cluster client to reload its slot map after a connection
// error or CLUSTERDOWN. Left alone, go-redis keeps sending a dead master's
// slots to it until its periodic reload (every 60s by default), long after
// a replica took over.
func (q *DelayQueue) noteError(ctx context.Context, err error) {
	cc, ok := q.client.(*redis.ClusterClient)
	if !ok || err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return
	}
	var reply redis.Error
	if !errors.As(err, &reply) || redis.IsClusterDownError(err) {
		cc.ReloadState(ctx) // in the background, at most every 200ms
	}
}
