package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/dqueue/delayqueue/internal/syncbuf"
	"github.com/dqueue/delayqueue/internal/tcpproxy"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The commands end to end: the built binary against a real redis-server,
// on a queue seeded through the library.

func TestStatsAndTopics(t *testing.T) {
	f := serverFixture(t)
	out := f.ok(t, "stats")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 7, out) // header, 4 topics, total, queue line
	assert.Regexp(t, `^TOPIC +DELAYED +READY +RESERVED +DEAD +OLDEST READY +PAUSED$`, lines[0])
	assert.Regexp(t, `^mail +0 +0 +0 +1 +- +no$`, lines[1])
	assert.Regexp(t, `^orders +1 +1 +1 +0 +\S+ +no$`, lines[2])
	assert.Regexp(t, `^paused +0 +0 +0 +0 +- +yes$`, lines[3])
	assert.Regexp(t, `^émoji\.☃ +0 +1 +0 +0 +\S+ +no$`, lines[4])
	assert.Regexp(t, `^TOTAL +1 +2 +1 +1 +\S+ *$`, lines[5])
	assert.Equal(t, "queue "+f.name+": 5 jobs in 1 bucket(s)", lines[6])

	var st struct {
		Queue   string
		Buckets int
		Jobs    int
		Topics  []topicJSON
		Total   countsJSON
	}
	f.json(t, &st, "stats")
	assert.Equal(t, f.name, st.Queue)
	assert.Equal(t, 5, st.Jobs)
	assert.Equal(t, countsJSON{Delayed: 1, Ready: 2, Reserved: 1, Dead: 1, OldestReadySeconds: st.Total.OldestReadySeconds}, st.Total)
	require.Len(t, st.Topics, 4)
	assert.Equal(t, "paused", st.Topics[2].Topic)
	assert.True(t, st.Topics[2].Paused)
	assert.Equal(t, 1, st.Topics[1].Reserved)

	assert.Equal(t, "mail\norders\npaused\némoji.☃\n", f.ok(t, "topics"))
	var topics []string
	f.json(t, &topics, "topics")
	assert.Equal(t, []string{"mail", "orders", "paused", "émoji.☃"}, topics)
	f.noLeases(t)
}

func TestListEveryState(t *testing.T) {
	f := serverFixture(t)
	for _, tc := range []struct {
		topic, state, id, when string
	}{
		{"orders", "delayed", f.delayed, `DUE +.*\n\S+ +delayed +in (?:59m5\ds|1h0m0s) +0/10 +orders +- +later`},
		{"orders", "ready", f.ready, `DUE +.*\n\S+ +ready +\S+ ago +0/10 +orders +- +now\\tplease`},
		{"orders", "reserved", f.reserved, `DEADLINE +.*\n\S+ +reserved +in (?:59m5\ds|1h0m0s) +1/10 +orders +- +being done`},
		{"mail", "dead", f.dead, `DIED +.*\n\S+ +dead +\S+ ago +1/1 +mail +smtp: 550 no such user +0xff0001`},
		{"émoji.☃", "ready", f.unicode, `\n\S+ +ready +.* +émoji\.☃ +- +snow`},
	} {
		t.Run(tc.state, func(t *testing.T) {
			out := f.ok(t, "list", tc.topic, "--state", tc.state)
			assert.Regexp(t, tc.when, out)
			assert.Contains(t, out, tc.id)
			var page struct {
				Jobs []jobJSON
				Next string
			}
			f.json(t, &page, "list", tc.topic, "--state", tc.state)
			require.Len(t, page.Jobs, 1)
			assert.Equal(t, tc.id, page.Jobs[0].ID)
			assert.Equal(t, tc.state, page.Jobs[0].State)
			assert.Empty(t, page.Next)
		})
	}
	f.noLeases(t)
}

func TestListAllFollowsTheCursors(t *testing.T) {
	f := serverFixture(t)
	ctx := context.Background()
	want := map[string]bool{f.delayed: true}
	for i := range 24 {
		id, err := f.q.Push(ctx, &delayqueue.Job{Topic: "orders", Delay: time.Hour + time.Duration(i)*time.Second})
		require.NoError(t, err)
		want[id] = true
	}
	var page struct {
		Jobs []jobJSON
		Next string
	}
	f.json(t, &page, "list", "orders", "--state", "delayed", "--limit", "10")
	require.Len(t, page.Jobs, 10)
	require.NotEmpty(t, page.Next, "a cursor for the next page")
	r := f.run(t, "list", "orders", "--state", "delayed", "--limit", "10", "--cursor", page.Next)
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stderr, "more jobs follow: --cursor ")
	assert.Len(t, strings.Split(strings.TrimSpace(r.stdout), "\n"), 11)

	f.json(t, &page, "list", "orders", "--state", "delayed", "--limit", "10", "--all")
	assert.Empty(t, page.Next)
	got := map[string]bool{}
	for _, j := range page.Jobs {
		assert.False(t, got[j.ID], "listed twice: %s", j.ID)
		got[j.ID] = true
	}
	assert.Equal(t, want, got)
}

func TestGet(t *testing.T) {
	f := serverFixture(t)
	out := f.ok(t, "get", f.delayed)
	for _, re := range []string{`(?m)^ID +` + f.delayed + `$`, `(?m)^Topic +orders$`, `(?m)^State +delayed$`,
		`(?m)^Due +\S+ \S+ \(in (?:59m5\ds|1h0m0s)\)$`, `(?m)^Attempts +0 of 10$`, `(?m)^Header trace +abc$`,
		`(?m)^Body +5 bytes\nlater\n$`} {
		assert.Regexp(t, re, out)
	}
	out = f.ok(t, "get", f.dead)
	assert.Regexp(t, `(?m)^Died +.* ago\)$`, out)
	assert.Regexp(t, `(?m)^Last error +smtp: 550 no such user$`, out)
	assert.Contains(t, out, "00000000  ff 00 01", "a binary body as a hex dump")
	assert.Equal(t, "\xff\x00\x01", f.ok(t, "get", f.dead, "--raw"))

	var j jobJSON
	f.json(t, &j, "get", f.dead)
	assert.Equal(t, []byte{0xff, 0, 1}, j.BodyBase64)
	assert.Nil(t, j.Body)
	died, err := time.Parse(time.RFC3339Nano, j.DiedAt)
	require.NoError(t, err)
	assert.Equal(t, time.UTC, died.Location())
	f.json(t, &j, "get", f.reserved)
	assert.NotEmpty(t, j.ReservedUntil)
	assert.Equal(t, "being done", *j.Body)
}

func TestPushThenGet(t *testing.T) {
	f := serverFixture(t)
	file := filepath.Join(t.TempDir(), "body")
	require.NoError(t, os.WriteFile(file, []byte("from a file\n"), 0o644))
	id := strings.TrimSpace(f.ok(t, "push", "émoji.☃", "--body", "@"+file, "--delay", "30s",
		"--ttr", "2m", "--max-attempts", "3", "--header", "k=v"))
	require.NotEmpty(t, id)
	var j jobJSON
	f.json(t, &j, "get", id)
	assert.Equal(t, "émoji.☃", j.Topic)
	assert.Equal(t, "delayed", j.State)
	assert.Equal(t, "from a file\n", *j.Body)
	assert.Equal(t, int64(120000), j.TTRMillis)
	assert.Equal(t, 3, j.MaxAttempts)
	assert.Equal(t, map[string]string{"k": "v"}, j.Headers)

	// --body @- reads stdin; --id makes the push idempotent.
	r := ctl(t, nil, "piped", append(f.flags, "push", "orders", "--id", "mine", "--body", "@-", "--at", "2001-02-03T04:05:06Z")...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "mine\n", r.stdout)
	var pushed struct {
		ID      string
		Existed bool
	}
	f.json(t, &pushed, "push", "orders", "--id", "mine")
	assert.Equal(t, "mine", pushed.ID)
	assert.True(t, pushed.Existed)
	assert.Equal(t, "piped", f.ok(t, "get", "mine", "--raw"))
}

func TestDestructiveCommandsAskFirst(t *testing.T) {
	f := serverFixture(t)
	for _, args := range [][]string{{"remove", f.delayed}, {"requeue", "--all", "mail"}, {"purge", "mail"}} {
		r := f.run(t, args...)
		assert.Equal(t, exitUsage, r.code, "%q", args)
		assert.Contains(t, r.stderr, "pass --yes", "%q", args)
		assert.Empty(t, r.stdout)
	}
	c, err := f.q.Counts(context.Background(), "mail")
	require.NoError(t, err)
	assert.Equal(t, 1, c.Dead, "nothing changed")
	_, err = f.q.Get(context.Background(), f.delayed)
	require.NoError(t, err, "nothing changed")

	assert.Equal(t, "removed "+f.delayed+"\n", f.ok(t, "remove", f.delayed, "--yes"))
	assert.Equal(t, exitNotFound, f.run(t, "get", f.delayed).code)
	assert.Equal(t, "requeued 1 dead jobs of mail\n", f.ok(t, "requeue", "--all", "mail", "--yes"))
	j, err := f.q.Get(context.Background(), f.dead)
	require.NoError(t, err)
	assert.Equal(t, delayqueue.StateReady, j.State)
	f.noLeases(t)
}

func TestRequeueOneAndPurge(t *testing.T) {
	f := serverFixture(t)
	r := f.run(t, "requeue", f.ready)
	assert.Equal(t, exitUsage, r.code, "a job that is not dead")
	assert.Contains(t, r.stderr, "is ready, not dead; nothing was changed")
	assert.Equal(t, exitNotFound, f.run(t, "requeue", "no-such-job").code)
	var res map[string]any
	f.json(t, &res, "requeue", f.dead)
	assert.Equal(t, f.dead, res["requeued"])

	j, err := f.q.Pop(context.Background(), "mail", time.Second)
	require.NoError(t, err)
	require.NoError(t, f.q.Retry(context.Background(), j, assert.AnError))
	res = nil
	f.json(t, &res, "purge", "mail", "-y")
	assert.Equal(t, map[string]any{"topic": "mail", "purged": float64(1)}, res)
	assert.Equal(t, exitNotFound, f.run(t, "get", f.dead).code)
	// Nothing to purge: nothing to ask, even without a terminal.
	assert.Equal(t, "no dead jobs of mail\n", f.ok(t, "purge", "mail"))
	r = f.run(t, "requeue", f.ready)
	assert.NotContains(t, r.stderr, "--help", "not a matter of usage")
}

// TestMessagesEscapeIDs: an ID with a right-to-left override or a byte
// that is not UTF-8 is printed escaped in a message, as in tables.
func TestMessagesEscapeIDs(t *testing.T) {
	f := serverFixture(t)
	for id, shown := range map[string]string{"lrm\u200fx": `lrm\u200fx`, "bad\xffbyte": `bad\xffbyte`} {
		_, err := f.q.Push(context.Background(), &delayqueue.Job{ID: id, Topic: "orders", Delay: time.Hour})
		require.NoError(t, err)
		assert.Equal(t, "removed "+shown+"\n", f.ok(t, "remove", id, "--yes"))
	}
}

func TestPauseAndResume(t *testing.T) {
	f := serverFixture(t)
	assert.Equal(t, "paused orders\n", f.ok(t, "pause", "orders"))
	ov, err := f.q.Overview(context.Background())
	require.NoError(t, err)
	paused := ov.Paused
	assert.ElementsMatch(t, []string{"orders", "paused"}, paused)
	assert.Equal(t, "resumed paused\n", f.ok(t, "resume", "paused"))
	var res map[string]any
	f.json(t, &res, "resume", "orders")
	assert.Equal(t, map[string]any{"topic": "orders", "paused": false}, res)
	ov, err = f.q.Overview(context.Background())
	require.NoError(t, err)
	paused = ov.Paused
	assert.Empty(t, paused)
}

func TestWatch(t *testing.T) {
	f := serverFixture(t)
	out := f.ok(t, "watch", "--count", "2", "--interval", "10ms")
	blocks := strings.Split(strings.TrimSpace(out), "\n\n")
	require.Len(t, blocks, 2, out)
	assert.NotContains(t, out, "\x1b[", "no screen codes when stdout is not a terminal")
	assert.Contains(t, blocks[0], "rates are net changes of the counts per second")
	assert.Regexp(t, `(?m)^orders +1 +1 +1 +0 +\S+ +no$`, blocks[0], "no rates on the first refresh")
	assert.Regexp(t, `(?m)^orders +1 \(\+0\.0/s\) +1 \(\+0\.0/s\) +1 \(\+0\.0/s\) +0 \(\+0\.0/s\) +\S+ +no$`, blocks[1])

	out = f.ok(t, "watch", "--count", "2", "--interval", "10ms", "--json")
	dec := json.NewDecoder(strings.NewReader(out))
	var first, second struct{ Topics []topicJSON }
	require.NoError(t, dec.Decode(&first))
	require.NoError(t, dec.Decode(&second))
	assert.Nil(t, first.Topics[1].Rates)
	assert.Equal(t, &ratesJSON{}, second.Topics[1].Rates)
	f.noLeases(t)
}

// TestWatchOutlivesAnOutage: while Redis cannot be reached, watch says so
// and keeps going; once it is back, the refreshes go on, the rates
// starting over. A refresh that failed counts toward --count, and makes
// the exit code 1.
func TestWatchOutlivesAnOutage(t *testing.T) {
	s := redistest.Shared(t)
	proxy, err := tcpproxy.Start(s.Addr, true)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	f := newFixture(t, s.Client(t), "--addr", proxy.Addr)

	const count = 6
	cmd := exec.Command(binPath, append(append([]string{}, f.flags...),
		"watch", "--json", "--count", fmt.Sprint(count), "--interval", "200ms")...)
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	dec := json.NewDecoder(stdout)
	type refresh struct{ Topics []topicJSON }
	var first refresh
	require.NoError(t, dec.Decode(&first))

	proxy.SetUp(false)
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "trying again") },
		time.Minute, 5*time.Millisecond, "watch says Redis cannot be read")
	proxy.SetUp(true)
	var after []refresh
	for {
		var r refresh
		if err := dec.Decode(&r); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		after = append(after, r)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stderr: %s", stderr.String())
	assert.Equal(t, exitError, exit.ExitCode())
	m := regexp.MustCompile(`(\d+) of 6 refreshes failed`).FindStringSubmatch(stderr.String())
	require.NotNil(t, m, "stderr: %s", stderr.String())
	fails, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.Len(t, after, count-1-fails, "every refresh shown or failed")
	require.NotEmpty(t, after, "refreshes go on after the outage")
	assert.Nil(t, after[0].Topics[1].Rates, "no rates across the outage")
	if len(after) > 1 {
		assert.NotNil(t, after[1].Topics[1].Rates)
	}
}

func TestExitCodes(t *testing.T) {
	f := serverFixture(t)
	client, flags := f.client, f.flags[:2]
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"get", "no-such-job"}, exitNotFound, "job not found"},
		{[]string{"remove", "no-such-job", "--yes"}, exitNotFound, "job not found"},
		{[]string{"list", "orders", "--state", "sleeping"}, exitUsage, `invalid state "sleeping"`},
		{[]string{"list", "two words"}, exitUsage, "invalid topic"},
		{[]string{"list", "orders", "--cursor", "bogus"}, exitUsage, "invalid cursor"},
		{[]string{"list", "orders", "--limit", "5000"}, exitUsage, "invalid limit"},
		{[]string{"list", "orders", "--limit", "0"}, exitUsage, "invalid limit"},
		{[]string{"--addr", "127.0.0.1:1", "list", "orders", "--limit", "0"}, exitUsage, "invalid limit"}, // before connecting
		{[]string{"--addr", "127.0.0.1:1", "list", "orders", "--state", "asleep"}, exitUsage, "invalid state"},
		{[]string{"push", "orders", "--delay", "soon"}, exitUsage, "invalid argument"},
		{[]string{"push", "orders", "--delay", "1s", "--at", "2030-01-01T00:00:00Z"}, exitUsage, "exclude each other"},
		{[]string{"push", "{orders}"}, exitUsage, "invalid topic"},
		{[]string{"push", "orders", "--body", "@/no/such/file"}, exitUsage, "no such file"},
		{[]string{"get"}, exitUsage, "want 1 argument"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"stats", "--bogus"}, exitUsage, "unknown flag"},
	} {
		r := f.run(t, tc.args...)
		assert.Equal(t, tc.code, r.code, "%q: %s", tc.args, r.stderr)
		assert.Contains(t, r.stderr, tc.stderr, "%q", tc.args)
		assert.Empty(t, r.stdout, "%q", tc.args)
	}

	r := ctl(t, nil, "", append(flags, "--queue", "never-opened", "stats")...)
	assert.Equal(t, exitNotFound, r.code)
	assert.Contains(t, r.stderr, `no such queue "never-opened"`)
	n, err := client.Exists(context.Background(), "dq:{never-opened}:meta").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "looking created nothing")

	r = ctl(t, nil, "", "--addr", "127.0.0.1:1", "stats")
	assert.Equal(t, exitError, r.code, "Redis unreachable")
	assert.Contains(t, r.stderr, "connection refused")
}

func TestPasswordFromTheEnvironment(t *testing.T) {
	s := redistest.Start(t)
	require.NoError(t, s.Client(t).ConfigSet(context.Background(), "requirepass", "s3cret").Err())
	client := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "s3cret"})
	t.Cleanup(func() { _ = client.Close() })
	f := newFixture(t, client, "--addr", s.Addr)
	r := f.run(t, "topics")
	assert.Equal(t, exitError, r.code, "no password")
	assert.Contains(t, r.stderr, "NOAUTH")
	r = ctl(t, []string{"DQ_REDIS_PASSWORD=s3cret"}, "", append(f.flags, "topics")...)
	assert.Equal(t, 0, r.code, r.stderr)
	r = ctl(t, []string{"MY_PW=s3cret"}, "", append(f.flags, "--password-env", "MY_PW", "topics")...)
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "orders")
}

func TestACLUser(t *testing.T) {
	s := redistest.Start(t)
	admin := s.Client(t)
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "ops", "on", ">0ps-pw", "~*", "&*", "+@all").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err())
	client := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "ops", Password: "0ps-pw"})
	t.Cleanup(func() { _ = client.Close() })
	f := newFixture(t, client, "--addr", s.Addr)

	r := ctl(t, []string{"DQ_REDIS_PASSWORD=0ps-pw"}, "", append(f.flags, "topics")...)
	assert.Equal(t, exitError, r.code, "the default user is off")
	r = ctl(t, []string{"DQ_REDIS_PASSWORD=0ps-pw"}, "", append(f.flags, "--user", "ops", "topics")...)
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "orders")
	r = ctl(t, []string{"DQ_REDIS_PASSWORD=0ps-pw", "DQ_REDIS_USER=ops"}, "", append(f.flags, "topics")...)
	assert.Equal(t, 0, r.code, r.stderr)
}

func TestAskTakesOnlyYes(t *testing.T) {
	var prompt strings.Builder
	for answer, ok := range map[string]bool{"y\n": true, "YES\n": true, "n\n": false, "\n": false, "": false, "yes please\n": false} {
		prompt.Reset()
		err := ask(context.Background(), strings.NewReader(answer), true, &prompt, "Remove it?")
		assert.Equal(t, ok, err == nil, "%q", answer)
		assert.Equal(t, "Remove it? [y/N] ", prompt.String())
		if err != nil {
			assert.Equal(t, exitUsage, exitCode(err))
		}
	}
	err := ask(context.Background(), strings.NewReader("y\n"), false, &prompt, "Remove it?")
	assert.Equal(t, exitUsage, exitCode(err), "no terminal, no question")
}

// TestAskEndsOnCtrlC: with no answer typed, Ctrl-C (the context ending)
// is a no, not a hang.
func TestAskEndsOnCtrlC(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var prompt strings.Builder
	done := make(chan error, 1)
	go func() { done <- ask(ctx, r, true, &prompt, "Remove it?") }()
	cancel()
	err := <-done
	assert.Equal(t, exitUsage, exitCode(err))
	assert.ErrorContains(t, err, "not confirmed")
}

// TestHeadersAndNamesComeBackAsGiven: a header's value keeps its commas and
// quotes, and a printed topic or ID with a backslash can be given back.
func TestHeadersAndNamesComeBackAsGiven(t *testing.T) {
	f := serverFixture(t)
	id := strings.TrimSpace(f.ok(t, "push", `top\ic`, "--id", `C:\temp\job`, "--body", "x",
		"--header", "tracestate=a=1,b=2", "--header", `q="quoted"`))
	require.Equal(t, `C:\temp\job`, id)
	var j struct {
		Headers map[string]string `json:"headers"`
	}
	f.json(t, &j, "get", id)
	assert.Equal(t, map[string]string{"tracestate": "a=1,b=2", "q": `"quoted"`}, j.Headers)
	assert.Contains(t, strings.Split(f.ok(t, "topics"), "\n"), `top\ic`)
	assert.Contains(t, f.ok(t, "list", `top\ic`), `C:\temp\job`)
	r := f.run(t, "push", "t", "--header", "novalue")
	assert.Equal(t, exitUsage, r.code)
}

// TestLookingWritesNothing: the commands that only look take no instance
// number of the queue, and write nothing at all.
func TestLookingWritesNothing(t *testing.T) {
	f := serverFixture(t)
	ctx := context.Background()
	meta := "dq:{" + f.name + "}:meta"
	before := f.client.HGetAll(ctx, meta).Val()
	for _, args := range [][]string{{"stats"}, {"topics"}, {"list", "orders"}, {"get", f.ready}} {
		f.ok(t, args...)
	}
	assert.Equal(t, before, f.client.HGetAll(ctx, meta).Val())
}

// TestPrintableKeepsTheTerminalHonest: text that would move the cursor
// back over what was shown, or reorder it, is dumped in hex instead.
func TestPrintableKeepsTheTerminalHonest(t *testing.T) {
	for body, ok := range map[string]bool{
		"plain text\n":            true,
		"tab\tand CRLF\r\nlines":  true,
		"ünïcödé":                 true,
		"paid\rNOT PAID":          false, // a lone CR
		"ends in CR\r":            false,
		"abc\u202edcba":           false, // right-to-left override
		"bell\a":                  false,
		"escape \x1b[2J sequence": false,
		"\xff\xfe":                false,
	} {
		assert.Equal(t, ok, printable([]byte(body)), "%q", body)
	}
}

func TestSchedulesListPauseResumeRemove(t *testing.T) {
	f := serverFixture(t)
	ctx := context.Background()
	require.NoError(t, f.q.Schedule(ctx, delayqueue.Schedule{Name: "digest", Every: time.Hour, Job: delayqueue.Job{Topic: "mail"}}))
	out := f.ok(t, "schedules")
	assert.Contains(t, out, "NAME")
	assert.Contains(t, out, "digest")
	assert.Contains(t, out, "1h0m0s")
	assert.Equal(t, "paused schedule digest\n", f.ok(t, "schedules", "pause", "digest"))
	var rows []map[string]any
	f.json(t, &rows, "schedules")
	require.Len(t, rows, 1)
	assert.Equal(t, true, rows[0]["paused"])
	assert.Equal(t, "resumed schedule digest\n", f.ok(t, "schedules", "resume", "digest"))
	assert.Equal(t, "removed schedule digest\n", f.ok(t, "schedules", "remove", "digest"))
	assert.NotEqual(t, 0, f.run(t, "schedules", "remove", "digest").code)
}

func TestLimitsSetShowClear(t *testing.T) {
	f := serverFixture(t)
	out := f.ok(t, "limits", "set", "orders", "--concurrency", "5", "--rate", "20")
	assert.Regexp(t, `(?m)^Concurrency +0 of 5$`, out)
	assert.Regexp(t, `(?m)^Rate +0 of 20 per 1s$`, out)
	l, err := f.q.Limits(context.Background(), "orders")
	require.NoError(t, err)
	assert.Equal(t, delayqueue.Limits{Concurrency: 5, Rate: 20, Per: time.Second}, l)
	var res map[string]any
	f.json(t, &res, "limits", "show", "orders")
	assert.Equal(t, map[string]any{"topic": "orders", "concurrency": 5.0, "rate": 20.0, "per": "1s",
		"running": 0.0, "in_window": 0.0}, res)
	assert.Equal(t, "cleared the limits of orders\n", f.ok(t, "limits", "clear", "orders"))
	l, err = f.q.Limits(context.Background(), "orders")
	require.NoError(t, err)
	assert.Zero(t, l)
}

// functions lists the libraries other versions left and, once confirmed,
// deletes them; this version's stay, and the queue goes on.
func TestFunctionsListsAndPrunesOtherVersionsLibraries(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	f := newFixture(t, s.Client(t), "--addr", s.Addr)
	old := "dq_" + strings.Repeat("cd", 20)
	require.NoError(t, f.client.FunctionLoad(ctx, "#!lua name="+old+"\nredis.register_function('"+old+"', function() return 1 end)\n").Err())
	ours, err := f.client.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "dq_*"}).Result()
	require.NoError(t, err)
	require.Greater(t, len(ours), 1, "the fixture's calls loaded this version's")

	assert.Equal(t, old+"\n1 libraries of other versions\n", f.ok(t, "functions"))
	r := f.run(t, "functions", "--prune")
	assert.Equal(t, exitUsage, r.code, "not confirmed without a terminal")
	assert.Contains(t, r.stderr, "Delete the 1 function libraries of other versions?")
	var res map[string][]string
	f.json(t, &res, "functions", "--prune", "--yes")
	assert.Equal(t, map[string][]string{"deleted": {old}}, res)
	left, err := f.client.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "dq_*"}).Result()
	require.NoError(t, err)
	assert.Len(t, left, len(ours)-1, "only the other version's is gone")
	assert.Equal(t, "0 libraries of other versions\n", f.ok(t, "functions", "--prune"), "nothing to ask")
	_, err = f.q.Push(ctx, &delayqueue.Job{Topic: "orders"})
	require.NoError(t, err)
}
