package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTrip pushes a job due now, pops it and finishes it.
func roundTrip(t *testing.T, q *DelayQueue, topic string) {
	t.Helper()
	ctx := context.Background()
	id := pushed(t, q, &Job{Topic: topic})
	job, err := q.Pop(ctx, topic, 0)
	require.NoError(t, err)
	assert.Equal(t, id, job.ID)
	require.NoError(t, q.Finish(ctx, job.ID))
}

// libraries returns the names of the queue's function libraries a server
// holds.
func libraries(t *testing.T, c redis.Cmdable) []string {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: functionPrefix + "*"}).Result()
	require.NoError(t, err)
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	return names
}

// The library of every script loads, and its helpers are defined on a
// first call: a helper too many for a function's upvalues, a name two
// library files define, or a global the library reaches as it loads, fails
// here rather than on the first call of a rarely run script.
func TestTheLibraryLoadsAndDefinesEveryScript(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	q := newQueue(t, c)
	require.True(t, q.usesFunctions())
	assert.Equal(t, []string{library().name}, libraries(t, c), "one library, loaded by New")
	files, err := fs.Glob(scriptFiles, "scripts/*.lua")
	require.NoError(t, err)
	require.Len(t, allScripts, len(files), "every script file is a function")
	for _, s := range allScripts {
		// Its first call defines the helpers: a global they reach, or
		// one missing, fails here. The call itself, without its keys
		// and arguments, may fail in the script's own lines.
		err := c.FCall(ctx, s.fn(), nil).Err()
		if err != nil {
			assert.NotContains(t, err.Error(), "global variable", s.name)
			assert.NotContains(t, err.Error(), "Function not found", s.name)
		}
	}
	require.NoError(t, q.loadLibrary(ctx), "loading the library the server holds is no error")
	assert.False(t, strings.Contains(library().text, "--"), "no comments")
}

// The replies that say a call did not run, and may be sent again, are told
// apart from a script's own errors: a script that ran part-way and failed
// must not run a second time by SHA.
func TestFunctionRepliesAreToldApart(t *testing.T) {
	for _, c := range []struct {
		reply   string
		missing bool
	}{
		{"ERR Function not found", true},
		{"ERR unknown command 'fcall', with args beginning with: 'dq_x' '0' ", false},
		{"NOPERM this user has no permissions to run the 'fcall' command", false},
		{"ERR Unknown command called from script script: dq_x, on @user_function:3.", false}, // Valkey 8
		{"ERR Unknown Redis command called from script script: dq_x", false},                 // Redis 7.0
		{"ERR user_function:12: Script attempted to access nonexistent global variable 'x'", false},
		{"NOPERM No permissions to access a key", false},
		{"OOM command not allowed when used memory > 'maxmemory'.", false},
		{"BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.", false},
		{"NOSCRIPT No matching script. Please use EVAL.", false},
	} {
		err := fmt.Errorf("delayqueue: %w", replyError(c.reply))
		assert.Equal(t, c.missing, functionMissing(err), c.reply)
		assert.Equal(t, c.missing || strings.HasPrefix(c.reply, "NOSCRIPT"), notRun(err), c.reply)
	}
	assert.False(t, notRun(errors.New("i/o timeout")), "a call without a reply may have run")
}

// On Redis 7 the scripts run as functions: FCALL, not EVALSHA, once the
// queue is open.
func TestScriptsRunAsFunctionsOnRedis7(t *testing.T) {
	c := redistest.Start(t).Client(t)
	q := newQueue(t, c, WithBuckets(1))
	before := commandCalls(t, c)
	roundTrip(t, q, "t")
	after := commandCalls(t, c)
	assert.Zero(t, after["evalsha"]-before["evalsha"], "no script runs by SHA")
	assert.GreaterOrEqual(t, after["fcall"]-before["fcall"], int64(3), "push, reserve and finish run as functions")
	assert.Subset(t, libraries(t, c), []string{library().name})

	// A process opened where the library is loaded already sends it no more.
	newQueue(t, c, WithName(q.opts.name))
	assert.Equal(t, after["function|load"], commandCalls(t, c)["function|load"])
}

// A server that lost the functions (FUNCTION FLUSH, or a restart without
// persistence) is sent each library again by the first call that misses it.
func TestAServerThatLostTheFunctionsIsSentThemAgain(t *testing.T) {
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		c := redistest.Start(t).Client(t)
		q := newQueue(t, c, WithBuckets(1))
		roundTrip(t, q, "t")
		require.NoError(t, c.FunctionFlush(ctx).Err())
		require.Empty(t, libraries(t, c))
		roundTrip(t, q, "t")
		assert.Subset(t, libraries(t, c), []string{library().name})
		assert.True(t, q.usesFunctions(), "still run as functions")
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3, 0)
		cc := redistest.ClusterClient(t, cl)
		q := newQueue(t, cc)
		for i := 0; i < 8; i++ { // generated IDs fill the buckets in turn
			roundTrip(t, q, "t")
		}
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FunctionFlush(ctx).Err()
		}))
		ids := pushN(t, q, 64, func(int) *Job { return &Job{Topic: "t"} })
		for range ids {
			job, err := q.Pop(ctx, "t", 0)
			require.NoError(t, err)
			require.NoError(t, q.Finish(ctx, job.ID))
		}
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			assert.Contains(t, libraries(t, m), library().name, "every master has it again")
			return nil
		}))
		assert.True(t, q.usesFunctions(), "still run as functions")
	})
}

// A server that refuses functions to the queue's user (an ACL without
// FCALL and FUNCTION) runs the scripts by SHA, as Redis 6 and miniredis do.
func TestAServerThatRefusesFunctionsRunsTheScriptsBySHA(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	admin := s.Client(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err())
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	q := newQueue(t, c, WithBuckets(1))
	roundTrip(t, q, "t")
	assert.False(t, q.usesFunctions(), "refused when the queue was opened")
	before := commandCalls(t, admin)
	roundTrip(t, q, "t")
	after := commandCalls(t, admin)
	assert.Zero(t, after["fcall"]-before["fcall"])
	assert.GreaterOrEqual(t, after["evalsha"]-before["evalsha"], int64(3))
	assert.Empty(t, libraries(t, admin))
}

// A server at maxmemory refuses to load a library: a call that frees
// memory and whose library the server lacks runs by SHA instead, so a full
// Redis that lost its functions still drains.
func TestAFullServerWithoutTheFunctionsStillDrains(t *testing.T) {
	ctx := context.Background()
	c := startFull(t)
	q := newQueue(t, c, WithBuckets(1))
	ids := fillRedis(t, q, "t", 0)
	require.NotEmpty(t, ids)
	require.NoError(t, c.FunctionFlush(ctx).Err())
	err := c.FunctionLoad(ctx, library().text).Err()
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "OOM"), "Redis is full: %v", err)
	for range 50 {
		job, err := q.Pop(ctx, "t", 0)
		require.NoError(t, err)
		require.NoError(t, q.Finish(ctx, job.ID))
	}
	assert.False(t, q.usesFunctions(), "for a while after a load failed, no call tries one")
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err()) // room again
	q.functionsOff.Store(0)                                      // the pause is over
	roundTrip(t, q, "u")
	assert.True(t, q.usesFunctions(), "with room again, the scripts run as functions")
	assert.Contains(t, libraries(t, c), library().name)
}

// loadElsewhere answers FUNCTION LOAD without sending it, as a client
// whose load goes to another server than its calls would.
type loadElsewhere struct{}

func (loadElsewhere) DialHook(next redis.DialHook) redis.DialHook { return next }

func (loadElsewhere) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && args[0] == "function" && args[1] == "load" {
			return nil
		}
		return next(ctx, cmd)
	}
}

func (loadElsewhere) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A call whose function is still missing after the queue loaded it (its
// client sent the load to another server) runs by SHA, and so do the
// process's calls for a while after it: they do not each pay for a load
// that never arrives.
func TestAFunctionStillMissingAfterItsLoadRunsBySHA(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	admin := s.Client(t)
	require.NoError(t, admin.FunctionFlush(ctx).Err())
	c := s.Client(t)
	c.AddHook(loadElsewhere{})
	q := newQueue(t, c, WithBuckets(1))
	roundTrip(t, q, "t")
	assert.False(t, q.usesFunctions())
	before := commandCalls(t, admin)
	roundTrip(t, q, "t")
	after := commandCalls(t, admin)
	assert.Zero(t, after["fcall"]-before["fcall"], "not tried again")
	assert.Empty(t, libraries(t, admin))
}

// oldLibrary is a library as an older version of the package would have
// left: named like the queue's, by a SHA1 this version's are not.
func oldLibrary(name string) string {
	return "#!lua name=" + name + "\nredis.register_function('" + name + "', function() return 1 end)\n"
}

// The libraries of other versions are found and deleted; this version's,
// and other users' libraries, are left; a process of the version deleted
// loads its own again.
func TestPruneFunctionsDeletesOnlyOtherVersionsLibraries(t *testing.T) {
	ctx := context.Background()
	old := functionPrefix + strings.Repeat("ab", 20)
	t.Run("redis", func(t *testing.T) {
		c := redistest.Start(t).Client(t)
		q := newQueue(t, c, WithBuckets(1))
		roundTrip(t, q, "t")
		for _, lib := range []string{oldLibrary(old), oldLibrary("dq_mine"), oldLibrary("billing")} {
			require.NoError(t, c.FunctionLoad(ctx, lib).Err())
		}
		stale, err := q.StaleFunctions(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{old}, stale)
		before := libraries(t, c)
		deleted, err := q.PruneFunctions(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{old}, deleted)
		assert.ElementsMatch(t, slices.DeleteFunc(before, func(n string) bool { return n == old }), libraries(t, c))
		again, err := q.PruneFunctions(ctx)
		require.NoError(t, err)
		assert.Empty(t, again, "nothing left to prune")
		roundTrip(t, q, "t")
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3, 0)
		cc := redistest.ClusterClient(t, cl)
		q := newQueue(t, cc)
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FunctionLoad(ctx, oldLibrary(old)).Err()
		}))
		deleted, err := q.PruneFunctions(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{old}, deleted, "once, though on every master")
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			assert.NotContains(t, libraries(t, m), old)
			return nil
		}))
	})
	t.Run("miniredis", func(t *testing.T) {
		q := newQueue(t, redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()}))
		stale, err := q.StaleFunctions(ctx)
		require.NoError(t, err)
		assert.Empty(t, stale, "a server without functions has none")
	})
}
