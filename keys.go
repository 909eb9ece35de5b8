package delayqueue

import (
	"strconv"
)

// keyspace builds every Redis key and channel name of one queue. Nothing else
// in the package concatenates key names.
//
// Every key of bucket b starts with "dq:{name:b}:", so the hash tag {name:b}
// puts all of them in one Redis Cluster slot, and different buckets of one
// queue in different slots:
//
//	dq:{name:b}:pool           HASH  job ID -> encoded job
//	dq:{name:b}:bucket         ZSET  job ID scored by due time or lease deadline (ms)
//	dq:{name:b}:ready:<topic>  LIST  IDs of ready jobs, oldest first
//	dq:{name:b}:dead:<topic>   ZSET  IDs of dead jobs scored by the time they died
//	dq:{name:b}:lock           STRING  the bucket handler's lease token
//	dq:{name:b}:deadtopics     SET   topics with dead letters in the bucket
//	dq:{name}:meta             HASH  bucket count and node sequence of the queue
//
// Pub/sub channels are not keys and carry no slot:
//
//	dq:{name}:wake           "<bucket>:<microseconds until due>" or "<bucket>:free"
//	dq:{name}:ready:<topic>  "<bucket>:<count>" when jobs became ready
type keyspace struct {
	name    string
	buckets []bucketKeys
}

// bucketKeys holds the fixed keys of one bucket, built once.
type bucketKeys struct {
	pool, zset, readyPrefix, deadPrefix, lock, deadTopics string
}

func newKeyspace(name string, buckets int) keyspace {
	ks := keyspace{name: name, buckets: make([]bucketKeys, buckets)}
	for b := range ks.buckets {
		prefix := "dq:{" + name + ":" + strconv.Itoa(b) + "}:"
		ks.buckets[b] = bucketKeys{
			pool:        prefix + "pool",
			zset:        prefix + "bucket",
			readyPrefix: prefix + "ready:",
			deadPrefix:  prefix + "dead:",
			lock:        prefix + "lock",
			deadTopics:  prefix + "deadtopics",
		}
	}
	return ks
}

func (ks keyspace) bucket(b int) bucketKeys { return ks.buckets[b] }

// ready is the ready list of topic in this bucket.
func (bk bucketKeys) ready(topic string) string { return bk.readyPrefix + topic }

// dead is the dead-letter set of topic in this bucket.
func (bk bucketKeys) dead(topic string) string { return bk.deadPrefix + topic }

func (ks keyspace) meta() string { return "dq:{" + ks.name + "}:meta" }

func (ks keyspace) wakeChannel() string { return "dq:{" + ks.name + "}:wake" }

func (ks keyspace) readyChannelPrefix() string { return "dq:{" + ks.name + "}:ready:" }

func (ks keyspace) readyChannel(topic string) string { return ks.readyChannelPrefix() + topic }
