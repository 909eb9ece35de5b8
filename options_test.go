package delayqueue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestNewRejectsBadOptions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		before := keysOfQueues(t, be.client, "default", "a{b", "a:b")
		for name, opt := range map[string]Option{
			"nil option":         nil,
			"empty name":         WithName(""),
			"name with brace":    WithName("a{b"),
			"name with colon":    WithName("a:b"),
			"zero buckets":       WithBuckets(0),
			"too many buckets":   WithBuckets(5000),
			"zero TTR":           WithDefaultTTR(0),
			"zero attempts":      WithMaxAttempts(0),
			"too many attempts":  WithMaxAttempts(65536),
			"TTR over 49 days":   WithDefaultTTR(maxTTR + time.Millisecond),
			"zero body":          WithMaxBodySize(0),
			"body over 16 MiB":   WithMaxBodySize(16<<20 + 1),
			"tiny lease":         WithLease(time.Millisecond),
			"zero batch":         WithBatchSize(0),
			"huge batch":         WithBatchSize(100000),
			"zero safety poll":   WithSafetyPoll(0),
			"nil logger":         WithLogger(nil),
			"negative dedup":     WithDedupWindow(-time.Second),
			"dedup over 49 days": WithDedupWindow(maxDedupWindow + time.Millisecond),
		} {
			q, err := New(be.client, opt)
			assert.ErrorIs(t, err, ErrInvalidOption, name)
			assert.Nil(t, q)
		}
		_, err := New(nil)
		assert.ErrorIs(t, err, ErrInvalidOption)
		assert.Equal(t, before, keysOfQueues(t, be.client, "default", "a{b", "a:b"), "a refused New writes nothing")
	})
}
