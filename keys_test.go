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
		for _, k := range []string{bk.zset, bk.lock, bk.deadTopics, bk.ready("email"), bk.dead("email")} {
			assert.Equal(t, s, slot.Of(k), "key %q of bucket %d", k, b)
		}
		slots[s] = true
	}
	assert.Len(t, slots, 16, "buckets should spread over slots")
	assert.Equal(t, "dq:{orders:3}:ready:email", ks.bucket(3).ready("email"))
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
		for _, k := range []string{bk.zset, bk.lock, bk.deadTopics, bk.ready(topic), bk.dead(topic), bk.readyPrefix, bk.deadPrefix} {
			require.Equal(t, s, slot.Of(k), "key %q", k)
		}
	})
}
