package delayqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis 7 and Valkey run each script as a function: the scripts of this
// version are one library, which defines their shared helpers once, where
// a script run by SHA defines them again on every call (a reserve call of
// one job spent about a tenth of its time on it). The library is named by
// the SHA1 of its text, and its functions by the library, so processes
// that run different versions share a server. New loads it on every
// server, and the scripts run as functions where that load succeeds; they
// run by SHA where it does not (Redis 6, miniredis, an ACL without
// FUNCTION or FCALL). A server that lacks the library later (it restarted
// without persistence, a new Cluster master, FUNCTION FLUSH) is sent it
// again by the first call that misses it; where that cannot be done (a
// server at maxmemory, a load that did not reach the call's server), the
// scripts run by SHA for a minute.

// functionPrefix opens the name of every library of the queue, and of
// its functions.
const functionPrefix = "dq_"

// functionsPause is how long the scripts run by SHA after a call could
// not use its function, before they are tried as functions again.
const functionsPause = time.Minute

// functionLibrary is this version's library: its name, its text, and the
// name of each script's function.
type functionLibrary struct {
	name, text string
	fns        map[*luaScript]string
}

// library returns the library of every script (allScripts) and every
// library file they include (scripts/lib), built once. Its helpers are
// defined on the first call of any of its functions
// (Redis 7.0 lets a library's own code, when loaded, reach no global but
// redis), each library file once, and kept for the calls after; each
// script's own lines become a function of KEYS and ARGV. Each function
// has its script's flags.
var library = sync.OnceValue(func() functionLibrary {
	files, err := fs.Glob(scriptFiles, "scripts/lib/*.lua")
	if err != nil {
		panic(err)
	}
	var libs []string
	for _, f := range files {
		libs = append(libs, strings.TrimSuffix(path.Base(f), ".lua"))
	}
	helpers, _, err := includedLibs(scriptFiles, "the library", includeLine+strings.Join(libs, " ")+"\n")
	if err != nil {
		panic(err)
	}
	const unnamed = "%NAME%"
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\nlocal function define()\n%s\nreturn {\n", unnamed, helpers)
	for _, s := range allScripts {
		fmt.Fprintf(&b, "[%q] = function(KEYS, ARGV)\n%s\nend,\n", s.name, withoutComments(s.body))
	}
	b.WriteString("}\nend\nlocal fns\nlocal function run(name)\n" +
		"  return function(keys, args)\n    fns = fns or define()\n    return fns[name](keys, args)\n  end\nend\n")
	for _, s := range allScripts {
		var quoted []string
		if list, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(s.flags, "#!lua")), "flags="); ok {
			for _, f := range strings.Split(list, ",") {
				quoted = append(quoted, "'"+f+"'")
			}
		}
		fmt.Fprintf(&b, "redis.register_function{function_name = '%s_%s', flags = {%s}, callback = run(%q)}\n",
			unnamed, s.name, strings.Join(quoted, ", "), s.name)
	}
	sum := sha1.Sum([]byte(b.String()))
	name := functionPrefix + hex.EncodeToString(sum[:])
	fns := make(map[*luaScript]string, len(allScripts))
	for _, s := range allScripts {
		fns[s] = name + "_" + s.name
	}
	return functionLibrary{name: name, text: strings.ReplaceAll(b.String(), unnamed, name), fns: fns}
})

// fn is the name of s's function in the library.
func (s *luaScript) fn() string { return library().fns[s] }

// loadFunctions loads the library on every server (eachServer) that does
// not hold it yet, and has the scripts run as functions when every server
// holds it then: what New chooses by.
func (q *DelayQueue) loadFunctions(ctx context.Context, log *slog.Logger) {
	if q.plain {
		return // miniredis has no functions
	}
	err := q.eachServer(ctx, func(ctx context.Context, c redis.Cmdable) error {
		held, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: library().name}).Result()
		if err != nil || len(held) > 0 {
			return err
		}
		return c.FunctionLoadReplace(ctx, library().text).Err()
	})
	if err != nil {
		log.Info("delayqueue: the scripts run by SHA: the server did not load their function library", attrError, err)
	}
	q.functions.Store(err == nil)
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
// them (loading the library where the server lacks it), by SHA elsewhere.
func (q *DelayQueue) runScript(ctx context.Context, s *luaScript, keys []string, args ...any) *redis.Cmd {
	if q.usesFunctions() {
		cmd := q.client.FCall(ctx, s.fn(), keys, args...)
		if !functionMissing(cmd.Err()) {
			return cmd
		}
		if q.loadLibrary(ctx) == nil {
			if cmd = q.client.FCall(ctx, s.fn(), keys, args...); !functionMissing(cmd.Err()) {
				return cmd
			}
		}
		// Not loaded, or loaded where the call does not go (a client
		// whose servers the queue cannot reach one by one).
		q.pauseFunctions()
	}
	return s.on(q.plain).Run(ctx, q.client, keys, args...)
}

// loadLibrary loads the library on every server (eachServer), replacing
// the one of the same name, so that loads made together never clash.
func (q *DelayQueue) loadLibrary(ctx context.Context) error {
	return q.eachServer(ctx, func(ctx context.Context, c redis.Cmdable) error {
		return c.FunctionLoadReplace(ctx, library().text).Err()
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
			if !isQueueFunction(l.Name) || l.Name == library().name {
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
// sent again as it is: the server lacks its script or its function.
func notRun(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT") || functionMissing(err)
}

// functionMissing reports whether err says the server lacks the function
// called.
func functionMissing(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "ERR Function not found")
}
