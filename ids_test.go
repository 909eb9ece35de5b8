package delayqueue

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func makeID(instance int64, count uint64) string {
	return string(appendBase58([]byte(*instancePrefix(instance)), count))
}

func TestIDsOfDifferentInstancesNeverMeet(t *testing.T) {
	seen := map[string][2]uint64{}
	// Around the points where the instance number and the count gain a digit.
	for _, instance := range []int64{1, 2, 57, 58, 59, 3363, 3364, 3365, 195112, 195113} {
		for count := range uint64(3500) {
			id := makeID(instance, count)
			prev, dup := seen[id]
			require.False(t, dup, "%q made by %v and by %v", id, prev, [2]uint64{uint64(instance), count})
			seen[id] = [2]uint64{uint64(instance), count}
		}
	}
	assert.Equal(t, "~221", makeID(1, 0), "short to begin with")
	assert.Len(t, makeID(2049, 1_000_000), 1+1+2+4)
}

func FuzzIDsNeverCollide(f *testing.F) {
	f.Add(int64(1), uint64(58), int64(58), uint64(0))
	f.Add(int64(1), uint64(0), int64(2), uint64(0))
	f.Fuzz(func(t *testing.T, i1 int64, c1 uint64, i2 int64, c2 uint64) {
		if i1 < 1 || i2 < 1 || (i1 == i2 && c1 == c2) {
			return
		}
		assert.NotEqual(t, makeID(i1, c1), makeID(i2, c2))
	})
}

func TestGeneratedIDsSpreadOverBuckets(t *testing.T) {
	var g idGen
	g.prefix.Store(instancePrefix(2049))
	counts := make([]int, 8)
	for range 80_000 {
		id := g.next()
		counts[bucketOf(id, 8)]++
	}
	for b, n := range counts {
		assert.InDelta(t, 10_000, n, 500, "bucket %d", b)
	}
}

func TestGeneratedIDsFillOneBucketAtATime(t *testing.T) {
	var g idGen
	g.prefix.Store(instancePrefix(3))
	seen := map[string]bool{}
	counts := make([]int, 8)
	for i := range 80_000 {
		id := g.nextIn(8, 5)
		require.False(t, seen[id], "%q made twice", id)
		seen[id] = true
		b := bucketOf(id, 8)
		// The i-th ID is the (i+1)-th made: runs of idRun from bucket 5.
		require.Equal(t, (5+(i+1)/idRun)%8, b, "ID %d", i)
		counts[b]++
	}
	for b, n := range counts {
		assert.InDelta(t, 10_000, n, idRun, "bucket %d: over time the IDs spread evenly", b)
	}
	id := g.nextIn(8, 6)
	assert.Equal(t, (6+80_001/idRun)%8, bucketOf(id, 8), "a new epoch moves on a bucket")
	assert.LessOrEqual(t, len(id), len(makeID(3, 80_000))+1, "skipped counts lengthen IDs by at most a digit")

	// One bucket, or too many to pick among: IDs by their hash alone,
	// no count skipped.
	for _, buckets := range []int{1, maxTargetBuckets + 1} {
		before := g.count.Load()
		g.nextIn(buckets, 5)
		assert.Equal(t, before+1, g.count.Load(), "%d buckets", buckets)
	}
}

func TestJobsPushedTogetherShareABucket(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		q := newQueue(t, be.client, WithBuckets(8))
		jobs := make([]*Job, 50)
		for i := range jobs {
			jobs[i] = &Job{Topic: "t", Delay: time.Hour}
		}
		_, err := q.PushMany(context.Background(), jobs)
		require.NoError(t, err)
		buckets := map[int]int{}
		for _, job := range jobs {
			buckets[bucketOf(job.ID, 8)]++
		}
		// Spread by their hash, 50 jobs would fill every bucket. A run of
		// IDs may end inside the call: at most two buckets.
		assert.LessOrEqual(t, len(buckets), 2, "jobs per bucket: %v", buckets)
		for b, n := range buckets {
			held, err := be.client.HLen(context.Background(), q.keys.bucket(b).pool).Result()
			require.NoError(t, err)
			assert.Equal(t, int64(n), held, "bucket %d holds the jobs filed in it", b)
		}
	})
}

// storedJobs counts the jobs in a queue's pools.
func storedJobs(t *testing.T, q *DelayQueue) int {
	t.Helper()
	st, err := readKeyStats(context.Background(), q, "t")
	require.NoError(t, err)
	return st.Jobs
}

// pushConcurrently pushes n jobs from each queue at once, 8 goroutines per
// queue, and returns the IDs acknowledged.
func pushConcurrently(t *testing.T, n int, qs ...*DelayQueue) []string {
	var mu sync.Mutex
	var acked []string
	var wg sync.WaitGroup
	for qi, q := range qs {
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					id, err := q.Push(context.Background(), &Job{Topic: "t", Body: []byte(fmt.Sprintf("%d/%d", qi, i)), Delay: time.Hour})
					if assert.NoError(t, err) {
						mu.Lock()
						acked = append(acked, id)
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	return acked
}

func distinct(ids []string) int {
	set := map[string]bool{}
	for _, id := range ids {
		set[id] = true
	}
	return len(set)
}

func TestGeneratedIDsStayUniqueAfterThousandsOfOpenings(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		name := uniqueName(t)
		first := newQueue(t, be.client, WithName(name))
		// 2,048 more openings: as many restarts, autoscaled processes or
		// New calls per request as a queue sees in a long life.
		for range 2047 {
			q, err := New(be.client, WithName(name), WithLogger(discard))
			require.NoError(t, err)
			require.NoError(t, q.Close(context.Background()))
		}
		last := newQueue(t, be.client, WithName(name))
		const n = 10_000
		acked := pushConcurrently(t, n, first, last)
		t.Logf("IDS 2,049 openings, pushes from the first and the last: acknowledged=%d distinct=%d stored=%d",
			len(acked), distinct(acked), storedJobs(t, first))
		assert.Len(t, acked, 2*n)
		assert.Equal(t, 2*n, distinct(acked))
		assert.Equal(t, 2*n, storedJobs(t, first))
	})
}

func TestCallersCannotTakeAGeneratedID(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		q := newQueue(t, be.client)
		next := string(appendBase58([]byte(*q.ids.prefix.Load()), q.ids.count.Load()))
		_, err := q.Push(ctx, &Job{ID: next, Topic: "t"})
		assert.ErrorIs(t, err, ErrInvalidID, "IDs that begin with ~ are the queue's")
		assert.ErrorIs(t, err, ErrInvalidJob)

		// The Job that Push gave an ID may be pushed again: it is the
		// same job, and nothing new is made.
		job := &Job{Topic: "t", Delay: time.Hour}
		id := pushed(t, q, job)
		assert.True(t, strings.HasPrefix(id, *q.ids.prefix.Load()), "%q is an ID of the queue's", id)
		again, err := q.Push(ctx, job)
		require.NoError(t, err)
		assert.Equal(t, id, again)
		assert.Equal(t, 1, storedJobs(t, q))
	})
}

func TestAGeneratedIDIsNeverAcknowledgedForAnotherJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		name := uniqueName(t)
		logs := &capture{}
		// One bucket, so that two instances of one number make the same
		// IDs in the same order. With more, each skips the counts outside
		// its bucket of the moment (idEpoch), and they meet wherever both
		// keep one count: the same check catches it, but not in an order
		// a test can count on.
		opts := []Option{WithName(name), WithLogger(logs.logger()), WithBuckets(1)}
		q := newQueue(t, be.client, opts...)

		// The instance counter went back, as when Redis lost its last
		// writes: a new process gets the number of a live one, and the two
		// make the same IDs. Jobs alike in every field but their due time
		// (a periodic tick, say) must not pass for one another.
		require.NoError(t, be.client.HIncrBy(ctx, q.keys.meta(), "nodes", -1).Err())
		again := newQueue(t, be.client, opts...)
		require.Equal(t, *q.ids.prefix.Load(), *again.ids.prefix.Load())
		first := pushed(t, q, &Job{Topic: "tick", Delay: time.Hour})
		second := pushed(t, again, &Job{Topic: "tick", Delay: 2 * time.Hour})
		assert.NotEqual(t, first, second)
		for id, due := range map[string]time.Duration{first: time.Hour, second: 2 * time.Hour} {
			job, err := q.Get(ctx, id)
			require.NoError(t, err)
			assert.WithinDuration(t, time.Now().Add(due), job.RunAt, time.Minute)
		}
		assert.Contains(t, logs.String(), "generated job ID was taken")

		const n = 2000
		acked := pushConcurrently(t, n, q, again)
		assert.Len(t, acked, 2*n)
		assert.Equal(t, 2*n, distinct(acked))
		assert.Equal(t, 2*n+2, storedJobs(t, q))

		// The same, in a batch.
		older := newQueue(t, be.client, opts...)
		require.NoError(t, be.client.HIncrBy(ctx, q.keys.meta(), "nodes", -1).Err())
		third := newQueue(t, be.client, opts...)
		require.Equal(t, *older.ids.prefix.Load(), *third.ids.prefix.Load())
		in := pushed(t, older, &Job{Topic: "t"}) // in the way of third's first ID
		jobs := []*Job{{Topic: "t"}}
		ids, err := third.PushMany(ctx, jobs)
		require.NoError(t, err)
		assert.NotEqual(t, in, ids[0].ID)
		assert.Equal(t, ids[0].ID, jobs[0].ID)
		assert.Equal(t, 2*n+4, storedJobs(t, q))
	})
}

// TestGeneratedIDsStayUniqueAcrossProcesses runs the first and the last of
// 2,049 openings of a queue as producer processes of their own, as API
// servers that never Start, pushing at once.
func TestGeneratedIDsStayUniqueAcrossProcesses(t *testing.T) {
	s := redistest.Shared(t)
	c := s.Client(t)
	name := uniqueName(t)
	dir := t.TempDir()
	n := scale(10_000, 50_000)
	env := []string{"DQ_N=" + strconv.Itoa(n)}
	first := startChild(t, "push", s.Addr, name, append(env, "DQ_OUT="+filepath.Join(dir, "first"))...)
	first.expect(t, "opened")
	for range 2047 {
		q, err := New(c, WithName(name), WithLogger(discard))
		require.NoError(t, err)
		require.NoError(t, q.Close(context.Background()))
	}
	last := startChild(t, "push", s.Addr, name, append(env, "DQ_OUT="+filepath.Join(dir, "last"))...)
	last.expect(t, "opened")
	first.say(t, "go")
	last.say(t, "go")
	first.expect(t, "pushed")
	last.expect(t, "pushed")

	var acked []string
	for _, f := range []string{"first", "last"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		acked = append(acked, strings.Fields(string(b))...)
	}
	q := newQueue(t, c, WithName(name))
	t.Logf("IDS two producer processes, the 1st and the 2,049th opening: acknowledged=%d distinct=%d stored=%d",
		len(acked), distinct(acked), storedJobs(t, q))
	assert.Len(t, acked, 2*n)
	assert.Equal(t, 2*n, distinct(acked))
	assert.Equal(t, 2*n, storedJobs(t, q))
}

// pushHelper is the child process of TestGeneratedIDsStayUniqueAcrossProcesses:
// it opens the queue, says so, waits for "go" on stdin, pushes DQ_N jobs
// with 8 goroutines and writes the acknowledged IDs to DQ_OUT.
func pushHelper(c *redis.Client, opts []Option) int {
	q, err := New(c, opts...)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("opened")
	if !readLine("go") {
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv("DQ_N"))
	ids := make([]string, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if id, err := q.Push(context.Background(), &Job{Topic: "t", Delay: time.Hour}); err == nil {
					ids[i] = id
				}
			}
		}()
	}
	wg.Wait()
	if err := os.WriteFile(os.Getenv("DQ_OUT"), []byte(strings.Join(ids, "\n")), 0o644); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("pushed")
	return 0
}
