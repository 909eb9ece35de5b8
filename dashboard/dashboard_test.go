package dashboard_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// count is the figure a topic's row of the overview shows for a state.
func count(t *testing.T, page, topic, state string) string {
	t.Helper()
	row := regexp.MustCompile(`(?s)<tr data-topic="` + regexp.QuoteMeta(topic) + `">.*?</tr>`).FindString(page)
	require.NotEmpty(t, row, "no row for %s", topic)
	m := regexp.MustCompile(`data-count="` + state + `">(\d+)<`).FindStringSubmatch(row)
	require.NotNil(t, m, "no %s count for %s", state, topic)
	return m[1]
}

func TestPagesShowEveryState(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		q := newQueue(t, c)
		ids := seed(t, q)
		s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/admin/queue")

		code, page := s.get("/")
		require.Equal(t, http.StatusOK, code, page)
		for state, want := range map[string]string{"ready": "3", "delayed": "1", "reserved": "1", "dead": "1"} {
			assert.Equal(t, want, count(t, page, "mail", state), state)
		}
		assert.Equal(t, "1", count(t, page, "paused", "delayed"))
		assert.Regexp(t, `(?s)data-topic="paused">.*badge paused.*Resume`, page)

		for state, want := range map[string][]string{
			"ready":    {ids.ready, ids.script, ids.binary},
			"delayed":  {ids.delayed},
			"reserved": {ids.reserved},
			"dead":     {ids.dead},
		} {
			code, page := s.get(topicPath("mail") + "?state=" + state)
			require.Equal(t, http.StatusOK, code, page)
			assert.Equal(t, want, listedIDs(page), state)
		}

		code, page = s.get(jobPath(ids.dead))
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "will die")
		assert.Contains(t, page, "1 of 1") // attempts
		assert.Contains(t, page, "Requeue")

		code, page = s.get(jobPath(ids.binary))
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "not text: hex")
		assert.Contains(t, page, "00 01 02 ff 68 69")
	})
}

var jobRow = regexp.MustCompile(`<tr data-job="([^"]+)">`)

// listedIDs are the IDs of the jobs a topic page lists, in order.
func listedIDs(page string) []string {
	var ids []string
	for _, m := range jobRow.FindAllStringSubmatch(page, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

func TestNothingInjectsMarkup(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ids := seed(t, q)
	ctx := context.Background()
	_, err := q.Push(ctx, &delayqueue.Job{Topic: scriptTag, Body: []byte(imgTag), ID: "id-" + scriptTag})
	require.NoError(t, err)
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "")

	pages := []string{"/", topicPath(scriptTag), jobPath("id-" + scriptTag), jobPath(ids.script), jobPath(ids.dead),
		topicPath("mail") + "?state=dead", topicPath(scriptTag) + "?state=bad" + url.QueryEscape(scriptTag)}
	for _, p := range pages {
		_, page := s.get(p)
		assert.NotContains(t, page, "<script>", p)
		assert.NotContains(t, page, "<img", p)
		assert.NotContains(t, page, "onerror=alert(1)>", p)
	}
	_, page := s.get(jobPath(ids.script))
	assert.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;")
	assert.Contains(t, page, "&#34;&#39;&gt;&lt;img src=x onerror=alert(1)&gt;") // body and header
	_, page = s.get(jobPath(ids.dead))
	assert.Contains(t, page, "&#34;&#39;&gt;&lt;img src=x onerror=alert(1)&gt;") // last error
}

// TestNamesShowAsTheyAre: a right-to-left override or a control
// character in an ID, a header or an error is shown escaped, so that
// "invoice\u202egpj.exe" cannot pass for "invoiceexe.jpg".
func TestNamesShowAsTheyAre(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	const id = "invoice\u202egpj.exe"
	_, err := q.Push(ctx, &delayqueue.Job{ID: id, Topic: "mail", Headers: map[string]string{"from": "bob\r\nX: 1"}})
	require.NoError(t, err)
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "")

	_, page := s.get(jobPath(id))
	assert.Contains(t, page, `<span class="name">invoice\u202egpj.exe</span>`)
	assert.Contains(t, page, `<title>Job invoice\u202egpj.exe`)
	assert.Contains(t, page, `<td>bob\r\nX: 1</td>`)
	_, page = s.get(topicPath("mail"))
	assert.Contains(t, page, `>invoice\u202egpj.exe</a>`)
	assert.NotContains(t, page, ">invoice\u202e", "the rune itself is in no text shown")
}

func TestActions(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		q := newQueue(t, c)
		ids := seed(t, q)
		s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/ops")

		page := s.act("/", topicPath("mail")+"/pause")
		assert.Contains(t, page, "Paused mail.")
		assert.Regexp(t, `(?s)data-topic="mail">.*?badge paused.*?</tr>`, page, "the overview reads anew after an action")
		assert.ElementsMatch(t, []string{"mail", "paused"}, paused(t, q))
		page = s.act("/", topicPath("mail")+"/resume")
		assert.Contains(t, page, "Resumed mail.")
		assert.Equal(t, []string{"paused"}, paused(t, q))

		deadPage := topicPath("mail") + "?state=dead"
		s.act(deadPage, jobPath(ids.dead)+"/requeue")
		assert.Equal(t, delayqueue.StateReady, state(t, q, ids.dead))

		kill(t, q, "mail", 2)
		page = s.act(deadPage, topicPath("mail")+"/requeue-dead")
		assert.Contains(t, page, "Requeued 2 dead jobs of mail.")
		kill(t, q, "mail", 3)
		page = s.act(deadPage, topicPath("mail")+"/purge-dead")
		assert.Contains(t, page, "Purged 3 dead jobs of mail.")
		counts, err := q.Counts(ctx, "mail")
		require.NoError(t, err)
		assert.Zero(t, counts.Dead)

		// Remove leads from the job's page to its topic's, in the state
		// the job was in.
		page = s.actTo(jobPath(ids.delayed), jobPath(ids.delayed)+"/remove", topicPath("mail")+"?state=delayed")
		assert.Contains(t, page, "Removed job "+ids.delayed)
		_, err = q.Get(ctx, ids.delayed)
		assert.ErrorIs(t, err, delayqueue.ErrNotFound)

		// A failed action says why on the page it returns to.
		form := s.formOf(jobPath(ids.ready), jobPath(ids.ready)+"/remove")
		require.NoError(t, q.Remove(ctx, ids.ready))
		require.Equal(t, s.prefix+topicPath("mail")+"?state=ready", s.send(jobPath(ids.ready)+"/remove", form))
		_, page = s.get(topicPath("mail") + "?state=ready")
		assert.Contains(t, page, "Failed: delayqueue: job not found")
	})
}

func paused(t *testing.T, q *delayqueue.DelayQueue) []string {
	t.Helper()
	ov, err := q.Overview(context.Background())
	require.NoError(t, err)
	return ov.Paused
}

func state(t *testing.T, q *delayqueue.DelayQueue, id string) delayqueue.State {
	t.Helper()
	job, err := q.Get(context.Background(), id)
	require.NoError(t, err)
	return job.State
}

// kill pushes n jobs to topic and sends them to the dead letters.
func kill(t *testing.T, q *delayqueue.DelayQueue, topic string, n int) {
	t.Helper()
	ctx := context.Background()
	ids := map[string]bool{}
	for i := range n {
		id, err := q.Push(ctx, &delayqueue.Job{Topic: topic, Body: []byte(fmt.Sprint("doomed ", i)), MaxAttempts: 1})
		require.NoError(t, err)
		ids[id] = true
	}
	for len(ids) > 0 {
		job, err := q.Pop(ctx, topic, 0)
		require.NoError(t, err)
		if ids[job.ID] {
			delete(ids, job.ID)
			require.NoError(t, q.Retry(ctx, job, delayqueue.ErrSkipRetry))
		} else {
			require.NoError(t, q.Release(ctx, job))
		}
	}
}

func TestActionsRefuseForgedRequests(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	seed(t, q)
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/admin/queue")
	action := topicPath("mail") + "/pause"
	good := s.token("/")

	for name, tc := range map[string]struct {
		form    url.Values
		headers []string
	}{
		"no token":         {url.Values{"back": {"/"}}, nil},
		"wrong token":      {url.Values{"csrf": {good[1:] + "A"}}, nil},
		"another's token":  {url.Values{"csrf": {otherToken(t)}}, nil},
		"cross-site":       {url.Values{"csrf": {good}}, []string{"Sec-Fetch-Site", "cross-site"}},
		"same-site":        {url.Values{"csrf": {good}}, []string{"Sec-Fetch-Site", "same-site"}},
		"another origin":   {url.Values{"csrf": {good}}, []string{"Origin", "https://evil.example"}},
		"a garbled origin": {url.Values{"csrf": {good}}, []string{"Origin", "::"}},
	} {
		resp, body := s.post(action, tc.form, tc.headers...)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, name)
		assert.Contains(t, body, "refused", name)
	}
	// Without the cookie, the token alone is refused.
	bare := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/admin/queue")
	bare.srv = s.srv
	resp, _ := bare.post(action, url.Values{"csrf": {good}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, []string{"paused"}, paused(t, q))

	// With both, the action goes through.
	resp, _ = s.post(action, url.Values{"csrf": {good}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.ElementsMatch(t, []string{"mail", "paused"}, paused(t, q))

	// Behind a reverse proxy that rewrote Host, the browser's own word
	// that the form is the page's (Sec-Fetch-Site) is taken over Origin.
	resume := topicPath("mail") + "/resume"
	resp, _ = s.post(resume, url.Values{"csrf": {good}}, "Origin", "https://admin.example.com", "Sec-Fetch-Site", "same-origin")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, []string{"paused"}, paused(t, q))

	// The page to go back to is a page of ours, or the overview.
	for _, to := range []string{"/\t/evil.example", "/ /evil.example", "//evil.example", "/\\evil.example", "https://evil.example",
		"/admin/queue//evil.example", "/admin/queue/../../evil", "/admin/queue/%2e%2E/evil", "/admin/queue/\\evil",
		"/admin/queue/ü", "/admin/queue/#x", "/admin/queueevil", "/admin/queue", "/topics/mail", ""} {
		resp, _ = s.post(resume, url.Values{"csrf": {good}, "back": {to}})
		assert.Equal(t, s.prefix+"/", resp.Header.Get("Location"), "%q", to)
	}
	for _, to := range []string{"/admin/queue/", "/admin/queue/topics/mail?state=dead&cursor=AAA", "/admin/queue/jobs/!Li4"} {
		resp, _ = s.post(resume, url.Values{"csrf": {good}, "back": {to}})
		assert.Equal(t, to, resp.Header.Get("Location"), "%q", to)
	}
}

// TestReplicasSharingAFormKeyTakeEachOthersForms: behind one address,
// replicas given the same FormKey take each other's forms; one with
// another key does not.
func TestReplicasSharingAFormKeyTakeEachOthersForms(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	seed(t, q)
	key := bytes.Repeat([]byte("k"), 32)
	a := serve(t, dashboard.New(q, dashboard.Options{Logger: discard, FormKey: key}), "/admin")
	good := a.token("/")
	replica := func(key []byte) *site {
		s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard, FormKey: key}), "/admin")
		s.client = a.client // the same browser, its cookie included
		return s
	}
	other := replica(bytes.Repeat([]byte("x"), 32))
	resp, _ := other.post(topicPath("mail")+"/pause", url.Values{"csrf": {good}}, "Sec-Fetch-Site", "same-origin")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "another key")
	assert.Equal(t, []string{"paused"}, paused(t, q))

	b := replica(key)
	resp, _ = b.post(topicPath("mail")+"/pause", url.Values{"csrf": {good}}, "Sec-Fetch-Site", "same-origin")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode, "the same key")
	assert.ElementsMatch(t, []string{"mail", "paused"}, paused(t, q))

	assert.PanicsWithValue(t, "dashboard: Options.FormKey holds 16 bytes; it needs at least 32", func() {
		dashboard.New(q, dashboard.Options{FormKey: make([]byte, 16)})
	})
}

// otherToken is a token another dashboard gave.
func otherToken(t *testing.T) string {
	q := newQueue(t, redistest.Shared(t).Client(t))
	seed(t, q)
	return serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "").token("/")
}

func TestActionsArePostOnly(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ids := seed(t, q)
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "")
	for _, action := range []string{"/pause", "/resume", "/requeue-dead", "/purge-dead"} {
		code, _ := s.get(topicPath("mail") + action)
		assert.Equal(t, http.StatusMethodNotAllowed, code, action)
	}
	for _, action := range []string{"/requeue", "/remove"} {
		code, _ := s.get(jobPath(ids.dead) + action)
		assert.Equal(t, http.StatusMethodNotAllowed, code, action)
	}
	resp, _ := s.post("/", nil)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	assert.Equal(t, []string{"paused"}, paused(t, q))
	assert.Equal(t, delayqueue.StateDead, state(t, q, ids.dead))
}

func TestReadOnly(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ids := seed(t, q)
	rw := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "")
	token := rw.token("/")
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard, ReadOnly: true}), "")
	for _, p := range []string{"/", topicPath("mail") + "?state=dead", jobPath(ids.dead)} {
		code, page := s.get(p)
		require.Equal(t, http.StatusOK, code)
		assert.NotContains(t, page, "<form", p)
		assert.Contains(t, page, "read-only", p)
	}
	s.client.Jar = rw.client.Jar
	resp, body := s.post(topicPath("mail")+"/pause", url.Values{"csrf": {token}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, body, "read-only")
	assert.Equal(t, []string{"paused"}, paused(t, q))
}

func TestPaging(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		q := newQueue(t, c, delayqueue.WithBuckets(3))
		var want []string
		for i := range 11 {
			id, err := q.Push(context.Background(), &delayqueue.Job{Topic: "a/b?c#d%e/ü", Body: []byte("x"), Delay: time.Hour + time.Duration(i)*time.Minute})
			require.NoError(t, err)
			want = append(want, id)
		}
		s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard, PageSize: 4}), "/q")
		var got []string
		next := topicPath("a/b?c#d%e/ü") + "?state=delayed"
		for pages := 0; next != ""; pages++ {
			require.Less(t, pages, 20, "no end to the pages")
			code, page := s.get(next)
			require.Equal(t, http.StatusOK, code, page)
			got = append(got, listedIDs(page)...)
			next = ""
			if m := regexp.MustCompile(`<a href="/q([^"]+)" rel="next">`).FindStringSubmatch(page); m != nil {
				next = strings.ReplaceAll(m[1], "&amp;", "&")
			}
		}
		assert.Equal(t, want, got)
	})
}

func TestOverviewShowsLimits(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		q := newQueue(t, c)
		seed(t, q)
		require.NoError(t, q.SetLimits(context.Background(), "mail", delayqueue.Limits{Concurrency: 4, Rate: 10}))
		s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/q")
		code, page := s.get("/")
		require.Equal(t, 200, code)
		assert.Regexp(t, `(?s)data-topic="mail">.*?badge limit[^>]*>0/4 at once, 0/10 per 1s</span>.*?</tr>`, page)
	})
}
