package delayqueue

import (
	"context"
	"embed"
	"errors"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dqueue/delayqueue/internal/batch"
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
	scriptUpsert     = loadScript("upsert.lua")
	scriptRequeue    = loadScript("requeue.lua")
	scriptPurge      = loadScript("purge.lua")
	scriptSummary    = loadScript("summary.lua")
	scriptList       = loadScript("list.lua")
	scriptGet        = loadScript("get.lua")
	scriptTicks      = loadScript("ticks.lua")
	scriptSchedule   = loadScript("schedule.lua")
	scriptAcquire    = loadScript("acquire.lua")
	scriptGiveBack   = loadScript("giveback.lua")
	scriptRenew      = loadScript("renew.lua")
	scriptHistory    = loadScript("history.lua")
)

// A luaScript is one script file in the two forms a server may need. A
// file opens with a flags line ("#!lua flags=allow-oom", say), which Redis
// 7 and Valkey read: a script that may grow memory is refused before it
// writes when Redis is at maxmemory, one that consumes (and so frees
// memory) runs (allow-oom), and one that only reads runs too (no-writes).
// miniredis cannot parse that line: it gets the plain form.
type luaScript struct {
	flagged, plain *redis.Script
}

// on returns the form a server takes.
func (s *luaScript) on(plain bool) *redis.Script {
	if plain {
		return s.plain
	}
	return s.flagged
}

func loadScript(name string) *luaScript {
	prelude, err := scriptFiles.ReadFile("scripts/job.lua")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	src, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic(err)
	}
	flags, body, ok := strings.Cut(string(src), "\n")
	if !strings.HasPrefix(flags, "#!lua") || !ok {
		panic("delayqueue: scripts/" + name + " does not open with a #!lua line")
	}
	code := preludeFor(string(prelude), body) + "\n" + body
	return &luaScript{flagged: redis.NewScript(flags + "\n" + code), plain: redis.NewScript(code)}
}

// isCompileError reports whether err is a server's refusal to compile a
// script, as miniredis refuses a flags line.
func isCompileError(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Error compiling script")
}

// preludeFor returns the part of job.lua that src needs: its constants, and
// the functions src calls, directly or through each other. A script runs
// its prelude on every call, and each function it defines costs a closure
// and its garbage, so a script carries only the helpers it uses. It reads
// job.lua by lines: a top-level "local function" ends at the first line
// that is "end", a "local" statement is one line, and "--" starts a
// comment; TestEveryScriptDefinesEveryNameItUses catches a script left
// without a helper it calls.
func preludeFor(prelude, src string) string {
	type block struct {
		name string // the function's name; "" for a block every script keeps
		text string
	}
	var blocks []block
	var pending []string // comments and blank lines, before what they describe
	lines := strings.Split(prelude, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		name, isFunc := strings.CutPrefix(line, "local function ")
		if !isFunc {
			if strings.HasPrefix(line, "local ") {
				blocks = append(blocks, block{text: strings.Join(append(pending, line), "\n")})
				pending = nil
			} else {
				pending = append(pending, line)
			}
			continue
		}
		name, _, _ = strings.Cut(name, "(")
		name = strings.TrimSpace(name)
		body := append(pending, line)
		pending = nil
		for i++; i < len(lines); i++ {
			body = append(body, lines[i])
			if lines[i] == "end" { // a top-level function ends at column 0
				break
			}
		}
		blocks = append(blocks, block{name: name, text: strings.Join(body, "\n")})
	}
	// Keep what src names, then what the kept functions name, until
	// nothing more is needed; definitions keep their order in job.lua.
	keep := map[string]bool{}
	need := []string{src}
	for len(need) > 0 {
		text := need[len(need)-1]
		need = need[:len(need)-1]
		names := luaNames(text)
		for _, b := range blocks {
			if b.name != "" && !keep[b.name] && names[b.name] {
				keep[b.name] = true
				need = append(need, b.text)
			}
		}
	}
	var out []string
	for _, b := range blocks {
		if b.name == "" || keep[b.name] {
			out = append(out, b.text)
		}
	}
	return strings.Join(out, "\n")
}

var (
	luaComment = regexp.MustCompile(`--.*`)
	luaName    = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
)

// luaNames is the set of names Lua code uses outside its comments.
func luaNames(code string) map[string]bool {
	names := map[string]bool{}
	for _, n := range luaName.FindAllString(luaComment.ReplaceAllString(code, ""), -1) {
		names[n] = true
	}
	return names
}

// scriptCall is one script call over the keys of one bucket.
type scriptCall struct {
	script *luaScript
	keys   []string
	args   []any
	cmd    *redis.Cmd // the reply, once sent
	// settles is set for a script of the settling kind (reserve, finish,
	// retry, release, touch), which deletes the answered reserve records of
	// its bucket given as keys after its own; bucket is then its bucket.
	settles bool
	bucket  int
}

// run runs a script by SHA over keys of bucket b. Concurrent calls share
// round trips: while one is in flight, the calls that follow wait and then
// go together in one pipeline (see callLanes).
func (q *DelayQueue) run(ctx context.Context, b int, s *luaScript, keys []string, args ...any) *redis.Cmd {
	c := &scriptCall{script: s, keys: keys, args: args, bucket: b, settles: s == scriptRetry || s == scriptRelease}
	if err := q.calls.For(b).Do(ctx, c); c.cmd == nil {
		// ctx ended while the call waited its turn: it was never sent.
		c.cmd = redis.NewCmd(ctx)
		c.cmd.SetErr(err)
	}
	return c.cmd
}

// callLanes coalesce the other script calls into pipelines, two in flight.
func (q *DelayQueue) callLanes(n int) batch.Lanes[*scriptCall] {
	return batch.NewLanes(n, maxPipelinedCalls, 2, q.flushCalls)
}

// flushCalls sends a batch of coalesced script calls.
func (q *DelayQueue) flushCalls(ctx context.Context, reqs []*batch.Request[*scriptCall]) {
	q.sendCalls(ctx, batch.Inputs(reqs))
	for _, r := range reqs {
		r.Err = r.In.cmd.Err()
	}
}

// sendCalls sends script calls, in one pipeline when there are several (one
// round trip per node), and sets each call's reply. A settling call takes
// its bucket's answered reserve records along as keys: no command of its
// own, and no extra command for a slot in a pipeline (go-redis's Cluster
// pipeline maps a command twice, and runs it on two connections at once,
// when another command of its batch to a moving slot is refused with
// TRYAGAIN).
func (q *DelayQueue) sendCalls(ctx context.Context, calls []*scriptCall) {
	if q.readTimeout > 0 {
		// Still waiting as long as the client waits for a reply: some
		// attempt got none in time (go-redis sends it again, and says
		// nothing of it), so the link may have gone silent, and the
		// subscriptions with it, which would otherwise notice only at
		// their health check.
		slow := time.AfterFunc(q.readTimeout, q.probeSubscriptions)
		defer slow.Stop()
	}
	q.attachRecords(calls)
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.on(q.plain).Run(ctx, q.client, c.keys, c.args...)
	} else {
		pipe := q.client.Pipeline()
		for _, c := range calls {
			c.cmd = c.script.on(q.plain).EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are read per call below
		for _, c := range calls {
			if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
				// Not run: the server has not seen the script yet (or
				// restarted). Run loads it.
				c.cmd = c.script.on(q.plain).Run(ctx, q.client, c.keys, c.args...)
			}
		}
	}
	for _, c := range calls {
		q.noteError(ctx, c.cmd.Err())
		if err := redisError(c.cmd.Err()); err != c.cmd.Err() {
			c.cmd.SetErr(err)
		}
	}
}

// resendWindow bounds how long a reserve call whose reply was lost is sent
// again: a connection cut, or a short partition, is over well within it.
const resendWindow = 10 * time.Second

// resendUnanswered sends again, with backoff, the calls whose outcome is
// unknown (the connection broke, or timed out, after go-redis's own
// retries), until each is answered, ctx ends, or within has passed. Only
// for scripts whose second run answers as the first did: reserve.lua,
// from its record.
func (q *DelayQueue) resendUnanswered(ctx context.Context, calls []*scriptCall, within time.Duration) {
	deadline := time.Now().Add(within)
	var timer *time.Timer
	for n := 1; ; n++ {
		var lost []*scriptCall
		for _, c := range calls {
			if unanswered(c.cmd.Err()) {
				lost = append(lost, c)
			}
		}
		wait := retryBackoff(n)
		if len(lost) == 0 || time.Now().Add(wait).After(deadline) {
			return
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		q.sendCalls(ctx, lost)
	}
}

// unanswered reports whether err leaves a call's outcome unknown: no reply
// came, and the script may have run.
func unanswered(err error) bool {
	var reply redis.Error
	switch {
	case err == nil, errors.As(err, &reply), errors.Is(err, redis.ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	return true
}

// probeSubscriptions has the subscriptions checked now (notifier.probe).
func (q *DelayQueue) probeSubscriptions() {
	q.mu.Lock()
	notes := q.notes
	q.mu.Unlock()
	if notes != nil {
		notes.probe()
	}
}

// byBucket splits items into the chunks that go in one script call each:
// those of one bucket, at most limit of them, in order.
func byBucket[T any](items []T, bucket func(T) int, limit int) [][]T {
	return byBucketSized(items, bucket, limit, nil, 0)
}

// byBucketSized is byBucket, with each chunk also at most maxSize in all by
// size (unless one item alone is more).
func byBucketSized[T any](items []T, bucket func(T) int, limit int, size func(T) int, maxSize int) [][]T {
	groups := map[int][]T{}
	var order []int
	for _, it := range items {
		b := bucket(it)
		if _, ok := groups[b]; !ok {
			order = append(order, b)
		}
		groups[b] = append(groups[b], it)
	}
	var chunks [][]T
	for _, b := range order {
		g := groups[b]
		for len(g) > 0 {
			n, total := 0, 0
			for n < len(g) && n < limit {
				if size != nil {
					total += size(g[n])
					if n > 0 && total > maxSize {
						break
					}
				}
				n++
			}
			chunks = append(chunks, g[:n:n])
			g = g[n:]
		}
	}
	return chunks
}

// forget has the record of a reserve call in bucket b deleted by the next
// settling call on that bucket (in the normal course, the one that settles
// a job the call reserved); the record expires in any case.
func (q *DelayQueue) forget(b int, record string) {
	q.forgetMu.Lock()
	defer q.forgetMu.Unlock()
	if q.forgets == nil {
		q.forgets = map[int][]string{}
	}
	q.forgets[b] = append(q.forgets[b], record)
}

// attachRecords gives each settling call its bucket's records, once.
func (q *DelayQueue) attachRecords(calls []*scriptCall) {
	q.forgetMu.Lock()
	defer q.forgetMu.Unlock()
	for _, c := range calls {
		if !c.settles || len(q.forgets[c.bucket]) == 0 {
			continue
		}
		c.keys = append(slices.Clip(c.keys), q.forgets[c.bucket]...)
		delete(q.forgets, c.bucket)
	}
}

// callName returns a name no other reserve call of any process has: a
// random name of this instance (not its instance number, which a counter
// that went back can hand out twice) and a count.
func (q *DelayQueue) callName() string {
	n := q.reserveCalls.Add(1)
	return string(appendBase58([]byte(q.callPrefix), n))
}

// readTimeout is how long client waits for a reply; 0 or less for none,
// or when it cannot tell.
func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

// recordLife is how long a reserve call's record lives when its caller
// never deletes it (the process died, or gave up on the reply): longer than
// go-redis can go on re-sending the call, as the client's options set it.
func recordLife(client redis.UniversalClient) time.Duration {
	var retries int
	var dial, read, write, backoff time.Duration
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		retries, dial, read, write, backoff = o.MaxRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := c.Options()
		retries, dial, read, write, backoff = o.MaxRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff
	default:
		return time.Minute
	}
	if read <= 0 || write <= 0 {
		// No timeout: a lost reply shows as a broken connection.
		read, write = max(read, 10*time.Second), max(write, 10*time.Second)
	}
	life := time.Duration(max(retries, 0)+1) * (dial + write + read + backoff)
	return max(life, 30*time.Second)
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

// maxPipelinedCalls bounds how many script calls go in one pipeline.
const maxPipelinedCalls = 256
