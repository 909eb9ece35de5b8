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

// run runs a script by SHA over keys of one bucket.
func (q *DelayQueue) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := s.Run(ctx, q.client, keys, args...)
	q.noteError(ctx, cmd.Err())
	return cmd
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
