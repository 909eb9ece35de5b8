package delayqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// loadFunction loads the library of s on every server (eachServer).
func (q *DelayQueue) loadFunction(ctx context.Context, s *luaScript) error {
	return q.eachServer(ctx, func(ctx context.Context, c redis.Cmdable) error {
		if err := c.FunctionLoad(ctx, s.lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
		return nil
	})
}

// eachServer runs f on the server, on every master of a Cluster, or on
// every shard of a Ring: where functions live.
func (q *DelayQueue) eachServer(ctx context.Context, f func(context.Context, redis.Cmdable) error) error {
	each := func(ctx context.Context, c *redis.Client) error { return f(ctx, c) }
	switch c := q.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, each)
	case *redis.Ring:
		return c.ForEachShard(ctx, each)
	default:
		return f(ctx, c)
	}
}

// ourFunctions are the names of this version's functions (loadScript).
var ourFunctions = map[string]bool{}

// isQueueFunction reports whether name is the name of a function of some
// version of this package: functionPrefix and a SHA1 in hex.
func isQueueFunction(name string) bool {
	sum, ok := strings.CutPrefix(name, functionPrefix)
	if !ok || len(sum) != 2*sha1.Size {
		return false
	}
	_, err := hex.DecodeString(sum)
	return err == nil && strings.ToLower(sum) == sum
}

// StaleFunctions returns the function libraries of other versions of this
// package on the server (on any master of a Cluster): the scripts of a
// version that changed them, left behind once no process runs it. They
// take memory, and are kept in the server's RDB and AOF files, until
// PruneFunctions deletes them. The libraries are the server's, not one
// queue's: all queues on it share them. A server without functions has
// none.
func (q *DelayQueue) StaleFunctions(ctx context.Context) ([]string, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	stale, err := q.staleFunctions(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("delayqueue: list functions: %w", err)
	}
	return stale, nil
}

// PruneFunctions deletes the libraries StaleFunctions returns, and returns
// their names. A process that still runs such a version loads its library
// again on its next call, so pruning while older processes run costs each
// of them a load, and fails none of their calls.
func (q *DelayQueue) PruneFunctions(ctx context.Context) ([]string, error) {
	if q.closed.Load() {
		return nil, ErrClosed
	}
	deleted, err := q.staleFunctions(ctx, func(ctx context.Context, c redis.Cmdable, name string) error {
		if err := c.FunctionDelete(ctx, name).Err(); err != nil && !strings.Contains(err.Error(), "not found") {
			return err // another prune may have deleted it first
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delayqueue: prune functions: %w", err)
	}
	return deleted, nil
}

// staleFunctions lists the libraries of other versions on every server,
// calls del (when given) for each where it is, and returns their names,
// sorted.
func (q *DelayQueue) staleFunctions(ctx context.Context, del func(context.Context, redis.Cmdable, string) error) ([]string, error) {
	if !q.functions.Load() {
		return nil, nil
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	err := q.eachServer(ctx, func(ctx context.Context, c redis.Cmdable) error {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: functionPrefix + "*"}).Result()
		if err != nil {
			return redisError(err)
		}
		for _, l := range libs {
			if !isQueueFunction(l.Name) || ourFunctions[l.Name] {
				continue
			}
			if del != nil {
				if err := del(ctx, c, l.Name); err != nil {
					return redisError(err)
				}
			}
			mu.Lock()
			seen[l.Name] = true
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	slices.Sort(names)
	return names, nil
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
