package delayqueue

import (
	"embed"

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
