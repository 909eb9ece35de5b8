package delayqueue

import (
	"testing"

	"github.com/dqueue/delayqueue/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeysOfABucketShareOneSlot(t *testing.T) {
	ks := newKeyspace("orders", 16)
	slots := map[int]bool{}
	for b := range 16 {
		bk := ks.bucket(b)
		s := slot.Of(bk.pool)
		for _, k := range []string{bk.zset, bk.lock, bk.deadTopics, bk.reservations, bk.record("21.5"), bk.ready("email"), bk.dead("email")} {
			assert.Equal(t, s, slot.Of(k), "key %q of bucket %d", k, b)
		}
		slots[s] = true
	}
	assert.Len(t, slots, 16, "buckets should spread over slots")
	assert.Equal(t, "dq:{orders:3~60}:ready:email", ks.bucket(3).ready("email"))
}

func TestBucketSlotsSpreadEvenly(t *testing.T) {
	for _, name := range []string{"default", "orders", "q", "a.very-long_queue.name"} {
		for _, n := range []int{1, 3, 8, 16, 256} {
			ks := newKeyspace(name, n)
			for b := range n {
				s := slot.Of(ks.bucket(b).pool)
				assert.GreaterOrEqual(t, s, b*slot.Count/n, "%s bucket %d of %d", name, b, n)
				assert.Less(t, s, (b+1)*slot.Count/n, "%s bucket %d of %d", name, b, n)
			}
		}
	}
	// Beyond 256 buckets the tags are plain.
	assert.Equal(t, "dq:{q:300}:pool", newKeyspace("q", 1000).bucket(300).pool)
}

// FuzzKeysOfAJobShareOneSlot checks that whatever topic and ID a job has,
// every key one script touches for it hashes to the slot of its bucket.
func FuzzKeysOfAJobShareOneSlot(f *testing.F) {
	f.Add("orders", "cancel", "42")
	f.Add("q", "a:b*c", "{x}")
	f.Add("q.1", "日本語", "id}{")
	f.Fuzz(func(t *testing.T, name, topic, id string) {
		if validName.FindString(name) == "" || validateTopic(topic) != nil || validateID(id) != nil {
			return
		}
		ks := newKeyspace(name, 8)
		bk := ks.bucket(bucketOf(id, 8))
		s := slot.Of(bk.pool)
		for _, k := range []string{bk.zset, bk.lock, bk.deadTopics, bk.reservations, bk.record(id), bk.ready(topic), bk.dead(topic), bk.readyPrefix, bk.deadPrefix} {
			require.Equal(t, s, slot.Of(k), "key %q", k)
		}
	})
}

// FuzzKeysNeverCollide checks that different queues, buckets and topics
// never share a key, and that no topic's list can be another key.
func FuzzKeysNeverCollide(f *testing.F) {
	f.Add("orders", 3, "a:b", "orders", 4, "a:b")
	f.Add("q", 0, "pool", "q", 0, "x")
	f.Add("a", 1, "ready:x", "a", 1, "x")
	f.Fuzz(func(t *testing.T, name1 string, b1 int, topic1, name2 string, b2 int, topic2 string) {
		if !validName.MatchString(name1) || !validName.MatchString(name2) ||
			validateTopic(topic1) != nil || validateTopic(topic2) != nil {
			return
		}
		b1, b2 = (b1%8+8)%8, (b2%8+8)%8
		k1, k2 := newKeyspace(name1, 8).bucket(b1), newKeyspace(name2, 8).bucket(b2)
		sameBucket := name1 == name2 && b1 == b2
		same := sameBucket && topic1 == topic2
		require.Equal(t, same, k1.ready(topic1) == k2.ready(topic2), "ready lists")
		require.Equal(t, same, k1.dead(topic1) == k2.dead(topic2), "dead letters")
		require.Equal(t, sameBucket, k1.pool == k2.pool, "pools")
		fixed := []string{k2.pool, k2.zset, k2.lock, k2.deadTopics, k2.reservations, newKeyspace(name2, 8).meta()}
		for _, k := range fixed {
			require.NotEqual(t, k, k1.ready(topic1))
			require.NotEqual(t, k, k1.dead(topic1))
		}
		require.NotEqual(t, k1.ready(topic1), k2.dead(topic2))
		require.NotEqual(t, k1.ready(topic1), k2.record(topic2))
		require.NotEqual(t, k1.dead(topic1), k2.record(topic2))
	})
}
