package delayqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis 7 and Valkey run each script as a function: its library, loaded
// once per server, defines the script's helpers once, where a script run
// by SHA defines them again on every call (a reserve call of one job spent
// about a tenth of its time on it). Each script is a library of its own,
// named by the SHA1 of its code, so processes that run different versions
// of the scripts share a server. A server that lacks a library (it
// restarted without persistence, a new Cluster master, FUNCTION FLUSH) is
// sent it on the first call that misses it. A server that refuses functions
// (Redis 6, miniredis, an ACL without FCALL or FUNCTION LOAD) runs the
// scripts by SHA, as a server at maxmemory does a call whose library it
// lacks.

// functionPrefix opens the name of every function of the queue, and of
// its library.
const functionPrefix = "dq_"

// functionOf returns a script as a function: its name, and the library of
// that one function. The library defines the script's helpers on its first
// call (Redis 7.0 lets a library's own code, when loaded, reach no global
// but redis), and keeps them for the calls after; the script's own lines
// become the function's body, with KEYS and ARGV as its arguments. Its
// flags are the script's flags line's.
func functionOf(flags, libs, body string) (name, lib string) {
	sum := sha1.Sum([]byte(flags + "\n" + joinCode(libs, body)))
	name = functionPrefix + hex.EncodeToString(sum[:])
	var quoted []string
	if list, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(flags, "#!lua")), "flags="); ok {
		for _, f := range strings.Split(list, ",") {
			quoted = append(quoted, "'"+f+"'")
		}
	}
	lib = fmt.Sprintf(`#!lua name=%s
local function define()
%s
return function(KEYS, ARGV)
%s
end
end
local main
redis.register_function{function_name = '%s', flags = {%s}, callback = function(keys, args)
  main = main or define()
  return main(keys, args)
end}
`, name, libs, body, name, strings.Join(quoted, ", "))
	return name, lib
}

// runScript runs script s over keys: as a function where the server takes
// them (loading its library where the server lacks it), by SHA elsewhere.
func (q *DelayQueue) runScript(ctx context.Context, s *luaScript, keys []string, args ...any) *redis.Cmd {
	if q.functions.Load() {
		cmd := q.client.FCall(ctx, s.fn, keys, args...)
		switch err := cmd.Err(); {
		case functionMissing(err):
			if q.loadFunction(ctx, s) == nil {
				if cmd = q.client.FCall(ctx, s.fn, keys, args...); !functionMissing(cmd.Err()) {
					return cmd
				}
				// Loaded, yet missed where the call goes: a client
				// whose servers the queue cannot reach one by one.
				q.functions.Store(false)
			}
		case functionsRefused(err):
			q.functions.Store(false)
		default:
			return cmd
		}
	}
	return s.on(q.plain).Run(ctx, q.client, keys, args...)
}

// loadFunction loads the library of s on the server, on every master of a
// Cluster, or on every shard of a Ring. A server that refuses functions has
// the queue run its scripts by SHA from then on.
func (q *DelayQueue) loadFunction(ctx context.Context, s *luaScript) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		if err := c.FunctionLoad(ctx, s.lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
		return nil
	}
	var err error
	each := func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }
	switch c := q.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Ring:
		err = c.ForEachShard(ctx, each)
	default:
		err = load(ctx, c)
	}
	if functionsRefused(err) {
		q.functions.Store(false)
	}
	return err
}

// notRun reports whether err says a script call was not run, and may be
// sent again as it is: the server lacks its script or its function.
func notRun(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT") || functionMissing(err) || functionsRefused(err)
}

// functionMissing reports whether err says the server lacks the function
// called.
func functionMissing(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.Contains(reply.Error(), "Function not found")
}

// functionsRefused reports whether err says the server does not run or load
// functions, or not for this client: no such command, or no permission for it.
func functionsRefused(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") ||
		strings.HasPrefix(msg, "noperm") && (strings.Contains(msg, "fcall") || strings.Contains(msg, "function"))
}
