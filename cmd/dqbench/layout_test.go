package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/dqueue/delayqueue/internal/syncbuf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJobBody(t *testing.T) {
	b := jobBody(19_999, 1_700_000_000_123)
	assert.Len(t, b, bodySize)
	job, due, err := parseBody(b)
	require.NoError(t, err)
	assert.Equal(t, 19_999, job)
	assert.Equal(t, int64(1_700_000_000_123), due)

	_, _, err = parseBody([]byte("no due time"))
	assert.Error(t, err)
}

func TestReceiptLine(t *testing.T) {
	want := receipt{job: 42, at: time.UnixMicro(1_700_000_000_123_456), due: time.UnixMilli(1_700_000_000_120), early: true, attempt: 2}
	line := appendReceipt(nil, want)
	require.Equal(t, byte('\n'), line[len(line)-1])
	got, err := parseReceipt(line[:len(line)-1])
	require.NoError(t, err)
	assert.Equal(t, want.job, got.job)
	assert.True(t, want.at.Equal(got.at))
	assert.True(t, want.due.Equal(got.due))
	assert.True(t, got.early)
	assert.Equal(t, 2, got.attempt)

	_, err = parseReceipt([]byte("r 1 2"))
	assert.Error(t, err)
}

func TestReceiptsCountFirstDeliveriesAndDuplicates(t *testing.T) {
	r := newReceipts(2)
	due := time.UnixMilli(1_000)
	add := func(job int, late time.Duration) {
		t.Helper()
		require.NoError(t, r.add(bytes.TrimSuffix(appendReceipt(nil, receipt{job: job, at: due.Add(late), due: due}), []byte("\n"))))
	}
	add(0, 2*time.Millisecond)
	add(0, time.Minute) // a duplicate: not a lateness sample
	select {
	case <-r.all:
		t.Fatal("all arrived with one job missing")
	default:
	}
	add(1, 3*time.Millisecond)
	<-r.all
	assert.Equal(t, 2, r.distinct)
	assert.Equal(t, 3, r.total)
	assert.Equal(t, []time.Duration{2 * time.Millisecond, 3 * time.Millisecond}, r.lates)
	assert.True(t, r.last.Equal(due.Add(3*time.Millisecond)))
	assert.Error(t, r.add([]byte("r 2 0 0 0 1")), "job number out of range")
}

func TestParseCPULine(t *testing.T) {
	a := parseCPULine("cpu  100 0 50 800 10 0 5 35 7 0")
	b := parseCPULine("cpu  200 0 100 1600 20 0 10 70 14 0")
	require.True(t, a.ok)
	assert.Equal(t, uint64(1000), a.total)
	assert.Equal(t, uint64(35), a.steal)
	assert.InDelta(t, 3.5, stealPercent(a, b), 1e-9)
	assert.True(t, math.IsNaN(stealPercent(a, parseCPULine("intr 1 2"))))
}

func TestCommandCountsOfTheBaseline(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_zadd:calls=10,usec=1\r\ncmdstat_evalsha:calls=1,usec=1\r\n" +
		"cmdstat_rpush:calls=1,usec=1\r\ncmdstat_zrangebyscore:calls=1,usec=1\r\ncmdstat_info:calls=3,usec=1\r\n"
	assert.Equal(t, commandCount{sent: 11, run: 13}, parseCommandStats(info, minScriptCommands))
	assert.Equal(t, commandCount{sent: 1, run: 13}, parseCommandStats(info, scriptCommands))
}

func TestScriptTimeCountsScriptsBySHAAndAsFunctions(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=1,usec=40,usec_per_call=40.00\r\n" +
		"cmdstat_fcall:calls=2,usec=70,usec_per_call=35.00\r\ncmdstat_zadd:calls=9,usec=9\r\n"
	assert.Equal(t, int64(110), scriptStatUsec(info))
}

func TestBlockedPopsAreCountedByCalls(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_blmpop:calls=7,usec=70,usec_per_call=10.00\r\n" +
		"cmdstat_blpop:calls=3,usec=9,usec_per_call=3.00\r\n"
	assert.Equal(t, int64(7), statCalls(info, "cmdstat_blmpop"))
	assert.Equal(t, int64(3), statCalls(info, "cmdstat_blpop"))
	assert.Zero(t, statCalls(info, "cmdstat_fcall"), "a command that never ran")
}

func TestChooseScenarios(t *testing.T) {
	in, layouts, err := chooseScenarios("")
	require.NoError(t, err)
	assert.Len(t, in, len(scenarios))
	assert.Empty(t, layouts)

	in, layouts, err = chooseScenarios("L, s2,p")
	require.NoError(t, err)
	require.Len(t, in, 1)
	assert.Equal(t, "s2", in[0].id)
	require.Len(t, layouts, 2)
	assert.Equal(t, "l", layouts[0].id)
	assert.Equal(t, "p", layouts[1].id)

	in, layouts, err = chooseScenarios("s1,s3")
	require.NoError(t, err)
	require.Len(t, in, 2, "the scenarios named, not every one after the last found")
	assert.Equal(t, "s1", in[0].id)
	assert.Equal(t, "s3", in[1].id)
	assert.Empty(t, layouts)

	in, layouts, err = chooseScenarios("iw,lim")
	require.NoError(t, err)
	require.Len(t, in, 2, "scenarios that run only when named")
	assert.ElementsMatch(t, []string{"iw", "lim"}, []string{in[0].id, in[1].id})
	assert.Empty(t, layouts)

	_, _, err = chooseScenarios("l,x")
	assert.ErrorContains(t, err, `"x"`)
	_, err = listFlag("topology", "single,ring", "single", "split", "multi")
	assert.Error(t, err)
}

// TestSingleProcessDeliversEveryJob runs a single-process child of each
// design in this process: it pushes jobs due at once and at a spread of
// due times, and every one arrives once, none early.
func TestSingleProcessDeliversEveryJob(t *testing.T) {
	srv := redistest.Start(t)
	type run struct{ impl, method, observe string }
	runs := []run{{"dq", "consume", observeProm}} // dqprom attached changes nothing delivered
	for _, impl := range designs {
		for _, method := range []string{"pop", "consume"} {
			if impl == "min" && method == "consume" {
				continue // the baseline has one way to consume
			}
			runs = append(runs, run{impl, method, observeNone})
		}
	}
	for _, r := range runs {
		impl, method, name := r.impl, r.method, r.impl+"-"+r.method+"-"+r.observe
		t.Run(name, func(t *testing.T) {
			const n = 500
			c := &childConfig{role: "single", impl: impl, method: method, addrs: []string{srv.Addr},
				queue: "t-" + name, jobs: n, due: dueAt, spread: 300 * time.Millisecond, start: true, observe: r.observe}
			ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
			defer stop()
			var buf syncbuf.Buffer
			out := newReporter(&buf, false)
			base := make(chan int64, 1)
			first := time.Now().Add(100 * time.Millisecond)
			base <- first.UnixMilli()
			done := make(chan childResult, 1)
			go func() { done <- c.run(ctx, base, out) }()
			require.Eventually(t, func() bool { return out.received() >= n }, 20*time.Second, 5*time.Millisecond)
			stop()
			res := <-done
			require.NoError(t, out.finish(res))

			got := newReceipts(n)
			var last childResult
			sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
			require.True(t, sc.Scan())
			assert.Equal(t, readyLine, sc.Text())
			for sc.Scan() {
				if line := sc.Bytes(); bytes.HasPrefix(line, []byte(receiptMark)) {
					require.NoError(t, got.add(line))
				} else {
					require.NoError(t, json.Unmarshal(line, &last))
				}
			}
			assert.Empty(t, last.Error)
			assert.Equal(t, n, last.Pushed)
			assert.Equal(t, n, last.Received)
			assert.Equal(t, n, got.distinct)
			assert.Equal(t, n, got.total)
			assert.Zero(t, got.early)
			for _, late := range got.lates {
				// Redis and the test share the machine's clock.
				assert.GreaterOrEqual(t, late, time.Duration(0))
			}
		})
	}
}

// A process that may be killed writes each receipt out before its handler
// returns: the receipts still in the buffer would die with it, while their
// jobs are finished, and the parent would count them missing.
func TestAReporterWritesEachReceiptOutAtOnce(t *testing.T) {
	var buf bytes.Buffer
	out := &reporter{w: bufio.NewWriterSize(&buf, 64<<10), flushEach: true} // no ticker
	out.record(delivery{body: jobBody(7, time.Now().UnixMilli())})
	got := newReceipts(8)
	require.NoError(t, got.add(bytes.TrimRight(buf.Bytes(), "\n")))
	assert.Equal(t, 1, got.distinct, "written before record returned")
}

func TestHogRefusesASharePastTheMachine(t *testing.T) {
	for _, share := range []float64{-0.1, 0, 1, 1.5} {
		_, err := startHog(share)
		assert.Error(t, err, "share %v", share)
		assert.Error(t, runHog([]string{strconv.FormatFloat(share, 'f', -1, 64)}), "share %v", share)
	}
	assert.Error(t, runHog(nil), "no share")
}

// The churn scenario's lateness is that of the jobs delivered at their
// first attempt; a job first delivered at a later one was held by a killed
// process and came back after its TTR, which is counted apart.
func TestChurnFiguresSetApartTheJobsAKilledProcessHeld(t *testing.T) {
	r := newReceipts(3)
	due := time.UnixMilli(1_000)
	for _, rc := range []receipt{
		{job: 0, at: due.Add(2 * time.Millisecond), due: due, attempt: 1},
		{job: 1, at: due.Add(5 * time.Second), due: due, attempt: 2},
		{job: 0, at: due.Add(6 * time.Second), due: due, attempt: 2}, // again: its process was killed before it finished it
	} {
		require.NoError(t, r.add(bytes.TrimSuffix(appendReceipt(nil, rc), []byte("\n"))))
	}
	figs, err := churnFigures(&outcome{jobs: 3, got: r, kills: 2})
	require.NoError(t, err)
	assert.Equal(t, []float64{2, 2, 2, 1, 0, 1, 1, 2}, figs,
		"lateness of job 0 alone; job 1 after a TTR; job 2 missing; job 0 delivered again; two killed")

	_, err = churnFigures(&outcome{jobs: 3, got: r})
	assert.Error(t, err, "no process killed: not a churn run")
}

func TestAProducerChildPushesWithTheGoroutinesItIsGiven(t *testing.T) {
	args := []string{"-role", "producer", "-addrs", "127.0.0.1:1", "-queue", "q"}
	c, err := parseChildFlags(args)
	require.NoError(t, err)
	assert.Equal(t, producers, c.producers, "the default")
	c, err = parseChildFlags(append(args, "-producers", "128"))
	require.NoError(t, err)
	assert.Equal(t, 128, c.producers)
	_, err = parseChildFlags(append(args, "-producers", "0"))
	assert.ErrorContains(t, err, "-producers 0")
}
