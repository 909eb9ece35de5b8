package delayqueue

import (
	"hash/crc32"
	"strconv"

	"github.com/dqueue/delayqueue/internal/slot"
)

// keyspace builds every Redis key and channel name of one queue. Nothing else
// in the package concatenates key names.
//
// Every key of bucket b starts with "dq:{name:b}:", so the hash tag {name:b}
// puts all of them in one Redis Cluster slot, and different buckets of one
// queue in different slots. With up to 256 buckets, the tag of bucket b of n
// is chosen so that its slot falls in the b-th n-th of the slot space,
// adding "~k" (the smallest k that does) when {name:b} itself does not: a
// cluster whose masters serve contiguous, even slot ranges (as redis-cli
// --cluster create makes them) then gets an even share of every queue.
//
//	dq:{name:b}:pool           HASH  job ID -> encoded job
//	dq:{name:b}:bucket         ZSET  job ID scored by due time or reservation deadline (ms)
//	dq:{name:b}:ready:<topic>  LIST  IDs of ready jobs, oldest first
//	dq:{name:b}:dead:<topic>   ZSET  IDs of dead jobs scored by the time they died
//	dq:{name:b}:lock           STRING  the bucket handler's lease token
//	dq:{name:b}:deadtopics     SET   topics with dead letters in the bucket
//	dq:{name:b}:leases         STRING  counter that numbers the bucket's reservations
//	dq:{name:b}:rsv:<slot>     STRING  what a reserve call reserved, until the process's next call there writes over it
//	dq:{name:b}:grant:<id>     STRING  "<reservation>\n<grant>": the grant of capacity a reserved job of a topic with a concurrency limit holds, for as long as its reservation and a second (scripts/lib/grants.lua)
//	dq:{name:b}:dedup          ZSET  IDs of jobs finished or removed, scored by the end of their dedup window
//	dq:{name:b}:counts         HASH  "<state>:<topic>" -> how many of the bucket's jobs of topic are delayed (1), ready (2) or reserved (3)
//	dq:{name:b}:sig:<topic>    LIST  one ready signal per ready job not yet claimed, which waiting consumers pop (BLPOP)
//	dq:{name:b}:standby        STRING  "<token> <lease ms> <next look, server ms>" of the bucket handler that stands by to take the bucket over (an older version's: the token alone)
//	dq:{name:b}:second         STRING  "<token> <lease ms> <next look, server ms>" of the second standby: it stands by in place of a standby that is late
//	dq:{name:b}:paused         SET   paused topics (every bucket holds the same)
//	dq:{name:b}:poke:<token>   LIST  a process's own key, pushed to wake its blocked pop (a moment only)
//	dq:{name:b}:lost:<topic>   STRING  until when (server ms) the latest look for a lost ready signal of topic stands, a second; one process a second looks (reserve.lua)
//	dq:{name:b}:schedules      HASH  schedule name -> its definition (schedule.go), for the schedules whose name falls in the bucket
//	dq:{name:b}:ticks          ZSET  schedule name scored by its next tick (ms), whose job is pushed already; none while paused
//	dq:{name:b}:lastticks      HASH  schedule name -> its latest tick that came (ms)
//	dq:{name:b}:watched        STRING  "<since ms> <until ms>": since when started processes have looked at the bucket with no gap, and until when the latest look vouches (schedule_tick.go)
//	dq:{name}:meta             HASH  bucket count, job encoding and node sequence of the queue
//	dq:{name}:limits           HASH  topic -> its limits, "<concurrency>:<rate>:<per ms>"
//	dq:{name}:lim:run:<topic>  ZSET  the topic's capacity grants, scored by deadline (ms)
//	dq:{name}:lim:rate:<topic> ZSET  the topic's grants of the last Per, scored by when granted (ms)
//	dq:{name}:lim:free:<topic> LIST  one entry per grant given back, which consumers at the limit pop (BLPOP)
//	dq:{name}:lim:rec:<call>   STRING  what one acquire call granted, for a second run
//	dq:{name}:lim:poke:<token> LIST  a consumer's own key, pushed to end its wait at the limit
//	dq:{name}:hist:tallies     HASH  "<f|k|n|s|m>:<topic>" -> jobs finished, died, reserved, and the reservations' lateness (sum, max ms), counted by started processes since the latest sample
//	dq:{name}:hist:latest      STRING  when the latest sample was claimed (server ms)
//	dq:{name}:hist:all         LIST  the queue's samples, oldest first, the last 360 (history.go)
//	dq:{name}:hist:t:<topic>   LIST  the topic's samples, oldest first, the last 360
//
// The limits' keys share the queue's slot: one script sees a topic's grants
// whichever buckets (and Cluster masters) hold its jobs.
//
// Each bucket also has a pub/sub channel under its tag, for the processes
// that hold or stand by for its lease, and the queue one for all. On Redis
// Cluster they are published with SPUBLISH, so a message stays on the shard
// that owns its slot instead of crossing the cluster bus to every node:
//
//	dq:{name:b}:ev:wake   "<microseconds until due>" or "free"
//	dq:{name}:ev:control  what every process hears: "resume:<topic>", "limits:<topic>", "standby:<bucket>", "sooner:<bucket>"
type keyspace struct {
	name    string
	buckets []bucketKeys
}

// bucketKeys holds the fixed keys of one bucket, built once.
type bucketKeys struct {
	pool, zset, readyPrefix, deadPrefix, lock, deadTopics, reservations, records, dedup, counts string
	sigPrefix, standby, second, paused, pokePrefix, lostPrefix, grants                          string
	schedules, ticks, lastTicks, watched                                                        string
	wake                                                                                        string // channel
}

func newKeyspace(name string, buckets int) keyspace {
	ks := keyspace{name: name, buckets: make([]bucketKeys, buckets)}
	for b := range ks.buckets {
		prefix := "dq:{" + bucketTag(name, b, buckets) + "}:"
		ks.buckets[b] = bucketKeys{
			pool:         prefix + "pool",
			zset:         prefix + "bucket",
			readyPrefix:  prefix + "ready:",
			deadPrefix:   prefix + "dead:",
			lock:         prefix + "lock",
			deadTopics:   prefix + "deadtopics",
			reservations: prefix + "leases",
			records:      prefix + "rsv:",
			grants:       prefix + "grant:",
			dedup:        prefix + "dedup",
			counts:       prefix + "counts",
			sigPrefix:    prefix + "sig:",
			standby:      prefix + "standby",
			second:       prefix + "second",
			paused:       prefix + "paused",
			pokePrefix:   prefix + "poke:",
			lostPrefix:   prefix + "lost:",
			schedules:    prefix + "schedules",
			ticks:        prefix + "ticks",
			lastTicks:    prefix + "lastticks",
			watched:      prefix + "watched",
			wake:         prefix + "ev:wake",
		}
	}
	return ks
}

func (ks keyspace) bucket(b int) bucketKeys { return ks.buckets[b] }

// bucketTag returns the hash tag of bucket b of n, without its braces.
func bucketTag(name string, b, n int) string {
	base := name + ":" + strconv.Itoa(b)
	if n > 256 {
		return base // windows too narrow to hit quickly; many buckets spread anyway
	}
	lo, hi := b*slot.Count/n, (b+1)*slot.Count/n
	for k := range 1 << 20 {
		tag := base
		if k > 0 {
			tag += "~" + strconv.Itoa(k)
		}
		if s := slot.Of("{" + tag + "}"); s >= lo && s < hi {
			return tag
		}
	}
	return base
}

// ready is the ready list of topic in this bucket.
func (bk bucketKeys) ready(topic string) string { return bk.readyPrefix + topic }

// record is where reserve.lua keeps what the reserve call named call
// reserved.
func (bk bucketKeys) record(call string) string { return bk.records + call }

// dead is the dead-letter set of topic in this bucket.
func (bk bucketKeys) dead(topic string) string { return bk.deadPrefix + topic }

func (ks keyspace) meta() string { return metaKey(ks.name) }

// metaKey is the meta hash of the queue named name.
func metaKey(name string) string { return "dq:{" + name + "}:meta" }

// limits is the hash of every topic's limits.
func (ks keyspace) limits() string { return "dq:{" + ks.name + "}:limits" }

// limitKeys are the keys of one limited topic's grants, and where its
// consumers at the limit wait.
type limitKeys struct{ run, rate, free string }

func (ks keyspace) limit(topic string) limitKeys {
	p := "dq:{" + ks.name + "}:lim:"
	return limitKeys{run: p + "run:" + topic, rate: p + "rate:" + topic, free: p + "free:" + topic}
}

// grantRecord is where acquire.lua keeps what the call named call granted.
func (ks keyspace) grantRecord(call string) string { return "dq:{" + ks.name + "}:lim:rec:" + call }

// limitPoke is a waiting consumer's own key beside the limits.
func (ks keyspace) limitPoke(token string) string { return "dq:{" + ks.name + "}:lim:poke:" + token }

// historyKeys are the keys of the queue's history (history.go).
type historyKeys struct{ tallies, latest, all, topicPrefix string }

func (ks keyspace) history() historyKeys {
	p := "dq:{" + ks.name + "}:hist:"
	return historyKeys{tallies: p + "tallies", latest: p + "latest", all: p + "all", topicPrefix: p + "t:"}
}

// series is the list of samples of topic, or of the whole queue for "".
func (hk historyKeys) series(topic string) string {
	if topic == "" {
		return hk.all
	}
	return hk.topicPrefix + topic
}

// control is the channel every process of the queue listens to.
func (ks keyspace) control() string { return "dq:{" + ks.name + "}:ev:control" }

// signals is the list of ready signals of topic in this bucket.
func (bk bucketKeys) signals(topic string) string { return bk.sigPrefix + topic }

// lost is the key that a look for a lost signal of topic in this bucket
// sets, so that one process a second looks.
func (bk bucketKeys) lost(topic string) string { return bk.lostPrefix + topic }

// poke is the key that wakes the blocked pop of the process whose token is
// token.
func (bk bucketKeys) poke(token string) string { return bk.pokePrefix + token }

// bucketOf maps a job ID to its bucket. It depends on the ID alone, so every
// process finds a job without a lookup; it must never change.
func bucketOf(id string, buckets int) int {
	return bucketOfBytes([]byte(id), buckets)
}

// bucketOfBytes is bucketOf of an ID in bytes.
func bucketOfBytes(id []byte, buckets int) int {
	return int(crc32.ChecksumIEEE(id) % uint32(buckets))
}

// bucketOfID checks an ID and returns its bucket.
func bucketOfID(id string, buckets int) (int, error) {
	if err := validateID(id); err != nil {
		return 0, err
	}
	return bucketOf(id, buckets), nil
}
