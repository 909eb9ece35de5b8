package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/dqueue/delayqueue/internal/redisproc"
	"github.com/redis/go-redis/v9"
)

// controlCommands are sent by the benchmark itself, not by the queue, and
// are left out of command counts.
var controlCommands = map[string]bool{"info": true, "config|resetstat": true, "flushall": true}

// scriptCommands are the commands the queue's scripts call. INFO
// commandstats counts a command run inside a script like one sent by a
// client; the queue itself sends none of these (but HGET for Get and
// HGETALL for Overview and Schedules, which the benchmark does not call
// but for -observe prom's scrape of Overview, one HGETALL and an SMEMBERS
// per bucket a second per process; SMEMBERS when dead letters are trimmed;
// and HINCRBY when a generated ID was taken).
var scriptCommands = map[string]bool{
	"time": true, "get": true, "set": true, "del": true, "pexpire": true, "pttl": true, "exists": true,
	"hget": true, "hgetall": true, "hset": true, "hdel": true, "hexists": true, "hsetnx": true, "hincrby": true,
	"zadd": true, "zrem": true, "zrange": true, "zrangebyscore": true, "zcard": true, "zscore": true, "zcount": true,
	"zremrangebyrank": true, "zremrangebyscore": true, "sadd": true, "srem": true,
	"rpush": true, "lpop": true, "publish": true, "hmget": true, "incrby": true, "spublish": true, "lrange": true, "ltrim": true, "llen": true, "sismember": true, "smembers": true, "scard": true, "hlen": true, "zrank": true,
}

// minScriptCommands are the commands the baseline's mover script calls;
// the baseline sends ZADD, EVALSHA and BLPOP itself.
var minScriptCommands = map[string]bool{
	"time": true, "zrangebyscore": true, "rpush": true, "zrem": true, "zrange": true,
}

// commandCount splits INFO commandstats into the commands clients sent and
// all commands run, those inside scripts included; cpu is the CPU time
// Redis used (INFO cpu, user and system), in seconds, and sys the part of
// it spent in the kernel (used_cpu_sys: the network, and going to sleep
// and waking); scripts the time it spent in scripts (scriptStatUsec), in
// microseconds; and blocked the blocked pops served or timed out
// (BLMPOP and BLPOP calls).
type commandCount struct {
	sent, run int64
	cpu, sys  float64
	scripts   int64
	blocked   int64
}

func (c commandCount) sub(d commandCount) commandCount {
	return commandCount{c.sent - d.sent, c.run - d.run, c.cpu - d.cpu, c.sys - d.sys, c.scripts - d.scripts, c.blocked - d.blocked}
}

func (c commandCount) perJob(n int) figures {
	return figures{
		{"commands sent per job", "", float64(c.sent) / float64(n)},
		{"commands run per job, incl. inside scripts", "", float64(c.run) / float64(n)},
	}
}

// commandCalls adds up INFO commandstats over every master.
func (b *bench) commandCalls(ctx context.Context) (commandCount, error) {
	return b.countCommands(ctx, scriptCommands)
}

// commandCallsOf is commandCalls for a layout design: "dq", the queue, or
// "min", the baseline, which sends some of the commands the queue runs only
// inside scripts.
func (b *bench) commandCallsOf(ctx context.Context, impl string) (commandCount, error) {
	if impl == "min" {
		return b.countCommands(ctx, minScriptCommands)
	}
	return b.countCommands(ctx, scriptCommands)
}

// countCommands adds up INFO commandstats over every master, counting the
// commands in inScripts as run but not sent.
func (b *bench) countCommands(ctx context.Context, inScripts map[string]bool) (commandCount, error) {
	var n commandCount
	for _, node := range b.nodes {
		info, err := node.Info(ctx, "commandstats", "cpu").Result()
		if err != nil {
			return commandCount{}, fmt.Errorf("info commandstats: %w", err)
		}
		n = n.add(parseCommandStats(info, inScripts))
		n.scripts += scriptStatUsec(info)
		n.blocked += statCalls(info, "cmdstat_blmpop") + statCalls(info, "cmdstat_blpop")
		user, sys := usedCPU(info)
		n.cpu += user + sys
		n.sys += sys
	}
	return n, nil
}

// usedCPU reads INFO cpu's CPU time of the server, in seconds: in user
// space and in the kernel.
func usedCPU(info string) (user, sys float64) {
	secs := func(field string) float64 {
		v, _ := infoField(info, field)
		f, _ := strconv.ParseFloat(v, 64)
		return f
	}
	return secs("used_cpu_user"), secs("used_cpu_sys")
}

func (c commandCount) add(d commandCount) commandCount {
	return commandCount{c.sent + d.sent, c.run + d.run, c.cpu + d.cpu, c.sys + d.sys, c.scripts + d.scripts, c.blocked + d.blocked}
}

func parseCommandStats(info string, inScripts map[string]bool) commandCount {
	var n commandCount
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat || controlCommands[name] {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				calls, _ := strconv.ParseInt(v, 10, 64)
				n.run += calls
				if !inScripts[name] {
					n.sent += calls
				}
			}
		}
	}
	return n
}

// usedMemory adds up INFO memory's used_memory, in bytes, over every master.
func (b *bench) usedMemory(ctx context.Context) (int64, error) {
	var total int64
	for _, node := range b.nodes {
		info, err := node.Info(ctx, "memory").Result()
		if err != nil {
			return 0, fmt.Errorf("info memory: %w", err)
		}
		v, ok := infoField(info, "used_memory")
		if !ok {
			return 0, fmt.Errorf("info memory: no used_memory")
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("info memory: %w", err)
		}
		total += n
	}
	return total, nil
}

// infoField finds "name:value" in an INFO reply.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, true
		}
	}
	return "", false
}

// redisVersion reads INFO server's redis_version.
func redisVersion(ctx context.Context, c *redis.Client) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "unknown"
	}
	if v, ok := infoField(info, "redis_version"); ok {
		return v
	}
	return "unknown"
}

// startServer starts a throwaway redis-server in a temporary directory.
func startServer() (*redisproc.Server, func(), error) {
	path, err := redisproc.Path()
	if err != nil {
		return nil, nil, fmt.Errorf("no -addr given and redis-server is not on PATH: %w", err)
	}
	dir, err := os.MkdirTemp("", "dqbench-")
	if err != nil {
		return nil, nil, err
	}
	s, err := redisproc.Start(path, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return s, func() { s.Stop(); _ = os.RemoveAll(dir) }, nil
}

// startCluster starts a throwaway 3-master Redis Cluster.
func startCluster() ([]string, func(), error) {
	path, err := redisproc.Path()
	if err != nil {
		return nil, nil, fmt.Errorf("-cluster: redis-server is not on PATH: %w", err)
	}
	dir, err := os.MkdirTemp("", "dqbench-cluster-")
	if err != nil {
		return nil, nil, err
	}
	c, err := redisproc.StartCluster(path, dir, 3, 0)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return c.Addrs(), func() { c.Stop(); _ = os.RemoveAll(dir) }, nil
}

// scriptUsec adds up the microseconds Redis spent in scripts on every
// master (scriptStatUsec).
func (b *bench) scriptUsec(ctx context.Context) (int64, error) {
	var total int64
	for _, node := range b.nodes {
		info, err := node.Info(ctx, "commandstats").Result()
		if err != nil {
			return 0, fmt.Errorf("info commandstats: %w", err)
		}
		total += scriptStatUsec(info)
	}
	return total, nil
}

// scriptStatUsec reads from INFO commandstats the microseconds spent in
// scripts, those run by SHA (EVALSHA) and as functions (FCALL).
func scriptStatUsec(info string) int64 {
	return statField(info, "cmdstat_evalsha", "usec=") + statField(info, "cmdstat_fcall", "usec=")
}

// statCalls is how many times INFO commandstats says the command of name
// (cmdstat_<command>) ran; 0 when it never did.
func statCalls(info, name string) int64 {
	return statField(info, name, "calls=")
}

// statField reads one counter (key, as "calls=") of a command's line of
// INFO commandstats; 0 when the command never ran.
func statField(info, name, key string) int64 {
	stats, _ := infoField(info, name)
	for _, kv := range strings.Split(stats, ",") {
		if v, ok := strings.CutPrefix(kv, key); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
