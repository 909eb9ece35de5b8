package delayqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis 7 and Valkey run each script as a function: its library, loaded
// once per server, defines the script's helpers once, where a script run
// by SHA defines them again on every call (a reserve call of one job spent
// about a tenth of its time on it). Each script is a library of its own,
// named by the SHA1 of its text, so processes that run different versions
// of the scripts share a server. New asks the server whether it runs
// functions. One that lacks a library (it restarted without persistence, a
// new Cluster master, FUNCTION FLUSH) is sent it by the first call that
// misses it. Where functions are refused (Redis 6, miniredis, an ACL
// without FCALL or FUNCTION LOAD) the scripts run by SHA; and for a minute
// after a library could not be loaded (a server at maxmemory) or did not
// reach the call's server, or the server refused functions since.

// functionPrefix opens the name of every function of the queue, and of
// its library.
const functionPrefix = "dq_"

// functionsPause is how long the scripts run by SHA after a call could
// not use its function, before they are tried as functions again.
const functionsPause = time.Minute

// functionOf returns a script as a function: its name, and the library of
// that one function. The library defines the script's helpers on its first
// call (Redis 7.0 lets a library's own code, when loaded, reach no global
// but redis), and keeps them for the calls after; the script's own lines
// become the function's body, with KEYS and ARGV as its arguments. Its
// flags are the script's flags line's. The name is the SHA1 of the
// library's text (without its name), so that a library changes its name
// whenever it changes.
func functionOf(flags, libs, body string) (name, lib string) {
	var quoted []string
	if list, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(flags, "#!lua")), "flags="); ok {
		for _, f := range strings.Split(list, ",") {
			quoted = append(quoted, "'"+f+"'")
		}
	}
	const unnamed = "%NAME%"
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
`, unnamed, libs, body, unnamed, strings.Join(quoted, ", "))
	sum := sha1.Sum([]byte(lib))
	name = functionPrefix + hex.EncodeToString(sum[:])
	return name, strings.ReplaceAll(lib, unnamed, name)
}

// probeFunctions asks the server whether it runs functions: it answers a
// call of a function it does not have with "Function not found".
func (q *DelayQueue) probeFunctions(ctx context.Context) {
	if q.plain {
		return // miniredis has no functions either
	}
	err := q.client.FCall(ctx, functionPrefix+"probe", nil).Err()
	q.functions.Store(functionMissing(err))
}

// usesFunctions reports whether the scripts run as functions now.
func (q *DelayQueue) usesFunctions() bool {
	return q.functions.Load() && time.Now().UnixNano() >= q.functionsOff.Load()
}

// pauseFunctions has the scripts run by SHA for functionsPause.
func (q *DelayQueue) pauseFunctions() {
	q.functionsOff.Store(time.Now().Add(functionsPause).UnixNano())
}

// runScript runs script s over keys: as a function where the server takes
// them (loading its library where the server lacks it), by SHA elsewhere.
func (q *DelayQueue) runScript(ctx context.Context, s *luaScript, keys []string, args ...any) *redis.Cmd {
	if q.usesFunctions() {
		cmd := q.client.FCall(ctx, s.fn, keys, args...)
		switch err := cmd.Err(); {
		case functionMissing(err):
			if q.loadFunction(ctx, s) == nil {
				if cmd = q.client.FCall(ctx, s.fn, keys, args...); !functionMissing(cmd.Err()) {
					return cmd
				}
			}
			// Not loaded, or loaded where the call does not go (a
			// client whose servers the queue cannot reach one by one).
			q.pauseFunctions()
		case functionsRefused(err):
			q.pauseFunctions()
		default:
			return cmd
		}
	}
	return s.on(q.plain).Run(ctx, q.client, keys, args...)
}

// loadFunction loads the library of s on the server, on every master of a
// Cluster, or on every shard of a Ring.
func (q *DelayQueue) loadFunction(ctx context.Context, s *luaScript) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		if err := c.FunctionLoad(ctx, s.lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
		return nil
	}
	each := func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }
	switch c := q.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, each)
	case *redis.Ring:
		return c.ForEachShard(ctx, each)
	default:
		return load(ctx, c)
	}
}

// notRun reports whether err says a script call was not run, and may be
// sent again as it is: the server lacks its script or its function, or
// refuses functions.
func notRun(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT") || functionMissing(err) || functionsRefused(err)
}

// functionMissing reports whether err says the server lacks the function
// called.
func functionMissing(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "ERR Function not found")
}

// functionsRefused reports whether err says the server does not run or
// load functions, or not for this client: FCALL or FUNCTION is an unknown
// command, or one the client may not run. A script's own error (an unknown
// command called from a script, a key the user may not touch) is not one.
func functionsRefused(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	if !strings.HasPrefix(msg, "ERR unknown command") && !strings.HasPrefix(msg, "NOPERM") {
		return false
	}
	lower := strings.ToLower(msg)
	for _, name := range []string{"'fcall'", "`fcall`", "'function", "`function"} {
		if strings.Contains(lower, name) {
			return true
		}
	}
	return false
}
