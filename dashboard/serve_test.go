package dashboard_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
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

func TestPrefixes(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ids := seed(t, q)
	odd := "a/b?c#d%e/ü"
	_, err := q.Push(context.Background(), &delayqueue.Job{Topic: odd, Body: []byte("odd")})
	require.NoError(t, err)
	d := dashboard.New(q, dashboard.Options{Logger: discard})
	for _, prefix := range []string{"", "/admin/queue", "/ops/dq-1"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			s := serve(t, d, prefix)
			code, page := s.get("/")
			require.Equal(t, http.StatusOK, code, page)
			// Every link and form stays below the prefix, and each leads
			// to a page.
			links := regexp.MustCompile(`(?:href|action|src)="([^"]*)"`).FindAllStringSubmatch(page, -1)
			require.NotEmpty(t, links)
			for _, m := range links {
				link := m[1]
				require.Regexp(t, "^"+regexp.QuoteMeta(prefix)+"/", link)
				if regexp.MustCompile(`/(pause|resume)$`).MatchString(link) {
					continue
				}
				code, _ := s.get(link[len(prefix):])
				assert.Equal(t, http.StatusOK, code, link)
			}
			assert.Contains(t, page, `href="`+prefix+`/topics/!YS9iP2MjZCVlL8O8"`)
			code, page = s.get(jobPath(ids.ready))
			require.Equal(t, http.StatusOK, code, page)
			assert.Contains(t, page, "hello, world")
			oddPage := topicPath(odd) + "?state=ready"
			s.act(oddPage, topicPath(odd)+"/pause")
			assert.Contains(t, paused(t, q), odd)
			s.act(oddPage, topicPath(odd)+"/resume")
		})
	}
}

func TestHeadersAndAssets(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/dq")
	for _, p := range []string{"/", "/static/dash.css", "/static/dash.js", "/nowhere"} {
		resp, err := s.client.Get(s.srv.URL + "/dq" + p)
		require.NoError(t, err)
		code, _ := readAll(t, resp)
		assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'", p)
		assert.NotContains(t, resp.Header.Get("Content-Security-Policy"), "unsafe-inline", p)
		assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), p)
		assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), p)
		assert.Equal(t, "same-origin", resp.Header.Get("Referrer-Policy"), p)
		if p == "/nowhere" {
			assert.Equal(t, http.StatusNotFound, code)
		} else {
			assert.Equal(t, http.StatusOK, code, p)
		}
	}
	resp, err := s.srv.Client().Get(s.srv.URL + "/dq/") // without the cookie
	require.NoError(t, err)
	_, _ = readAll(t, resp)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "dq_dashboard_csrf" {
			cookie = c
		}
	}
	require.NotNil(t, cookie)
	assert.True(t, cookie.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	assert.Equal(t, "/dq/", cookie.Path)
	code, _ := s.get("/static/../dashboard.go")
	assert.NotEqual(t, http.StatusOK, code)
}

func TestErrorPages(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ids := seed(t, q)
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "")
	for p, want := range map[string]int{
		jobPath("no-such-job"):                  http.StatusNotFound,
		"/jobs/!!":                              http.StatusBadRequest,
		"/topics/!":                             http.StatusBadRequest,
		jobPath("a\x01b"):                       http.StatusBadRequest,
		topicPath("a b"):                        http.StatusBadRequest,
		topicPath("mail") + "?state=gone":       http.StatusBadRequest,
		topicPath("mail") + "?cursor=AAAA":      http.StatusBadRequest,
		topicPath("mail") + "/nothing":          http.StatusNotFound,
		jobPath(ids.ready) + "/nothing":         http.StatusNotFound,
		"/topics":                               http.StatusNotFound,
		"/static/nothing.css":                   http.StatusNotFound,
		topicPath("mail") + "?state=dead&x=<b>": http.StatusOK,
	} {
		code, page := s.get(p)
		assert.Equal(t, want, code, p)
		assert.Contains(t, page, "</html>", p)
	}

	// An error of Redis is a 500 page that says so, without its details
	// (addresses, say), which are logged.
	var logs bytes.Buffer
	broken := failing{Queue: q, err: errors.New("connection refused")}
	s = serve(t, dashboard.New(broken, dashboard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}), "")
	for _, p := range []string{"/", topicPath("mail"), jobPath(ids.ready)} {
		code, page := s.get(p)
		assert.Equal(t, http.StatusInternalServerError, code, p)
		assert.Contains(t, page, "Redis did not answer", p)
		assert.NotContains(t, page, "connection refused", p)
	}
	assert.Contains(t, logs.String(), "connection refused")
}

// failing is a queue whose reads fail.
type failing struct {
	dashboard.Queue
	err error
}

func (f failing) Overview(context.Context) (delayqueue.Overview, error) {
	return delayqueue.Overview{}, f.err
}

func (f failing) Counts(context.Context, string) (delayqueue.Counts, error) {
	return delayqueue.Counts{}, f.err
}
func (f failing) Get(context.Context, string) (*delayqueue.Job, error) { return nil, f.err }

// TestCharts: a dashboard in a process that never starts (an API process
// that only pushes) shows the history that a started process keeps in
// Redis, on the overview and on a topic's page.
func TestCharts(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		name := fmt.Sprintf("charts-%d", nameSeq.Add(1))
		seed(t, newQueue(t, c, delayqueue.WithName(name)))
		api := newQueue(t, c, delayqueue.WithName(name), delayqueue.WithoutInstance())
		s := serve(t, dashboard.New(api, dashboard.Options{Logger: discard}), "")
		_, page := s.get("/")
		assert.NotContains(t, page, "<svg")
		assert.Contains(t, page, "No history yet: no started process")

		worker := startedTwin(t, c, name)
		require.Eventually(t, func() bool {
			finishOne(t, worker, "work") // a queue at work is sampled every interval
			samples, err := api.History(context.Background(), "mail")
			return err == nil && len(samples) >= 3
		}, 15*time.Second, 50*time.Millisecond)
		page = s.act("/", topicPath("mail")+"/pause") // an action drops the cached figures
		assert.Equal(t, 3, bytes.Count([]byte(page), []byte(`<svg class="chart"`)))
		for _, title := range []string{"Jobs by state", "Throughput", "Lateness"} {
			assert.Contains(t, page, title)
		}
		_, page = s.get(topicPath("mail"))
		assert.Equal(t, 3, bytes.Count([]byte(page), []byte(`<svg class="chart"`)), "the topic's own charts")
		_, page = s.get(topicPath("none"))
		assert.Contains(t, page, "No history yet", "a topic with no sample")
	})
}

// finishOne pushes a job to topic, pops it and finishes it.
func finishOne(t *testing.T, q *delayqueue.DelayQueue, topic string) {
	t.Helper()
	ctx := context.Background()
	_, err := q.Push(ctx, &delayqueue.Job{Topic: topic})
	require.NoError(t, err)
	job, err := q.Pop(ctx, topic, time.Second)
	require.NoError(t, err)
	require.NoError(t, q.Finish(ctx, job.ID))
}

// startedTwin opens the queue named name again, as another process would, and
// starts it, sampling every second.
func startedTwin(t *testing.T, c redis.UniversalClient, name string) *delayqueue.DelayQueue {
	t.Helper()
	twin := newQueue(t, c, delayqueue.WithName(name), delayqueue.WithHistory(time.Second))
	require.NoError(t, twin.Start(context.Background()))
	return twin
}

// A mounting is a way to serve a dashboard of q under a prefix.
type mounting struct {
	name  string
	mount func(mux *http.ServeMux, prefix string, q dashboard.Queue)
}

var mountings = []mounting{
	{"StripPrefix", func(mux *http.ServeMux, prefix string, q dashboard.Queue) {
		mux.Handle(prefix+"/", http.StripPrefix(prefix, dashboard.New(q, dashboard.Options{Logger: discard})))
	}},
	{"StripPrefix with the slash", func(mux *http.ServeMux, prefix string, q dashboard.Queue) {
		mux.Handle(prefix+"/", http.StripPrefix(prefix+"/", dashboard.New(q, dashboard.Options{Logger: discard})))
	}},
	{"behind a proxy that takes the prefix away", func(mux *http.ServeMux, prefix string, q dashboard.Queue) {
		d := dashboard.New(q, dashboard.Options{Logger: discard, Prefix: prefix})
		mux.Handle(prefix+"/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r2 := r.Clone(r.Context())
			r2.URL.Path = strings.TrimPrefix(r.URL.Path, prefix)
			r2.URL.RawPath = strings.TrimPrefix(r.URL.RawPath, prefix)
			r2.RequestURI = strings.TrimPrefix(r.RequestURI, prefix)
			d.ServeHTTP(w, r2)
		}))
	}},
}

// oddNames are topics and IDs that a path does not hold as they are.
var oddNames = []string{".", "..", "a/b", "a/../b", "/", "%", "%2e%2e", "?x#y&z=1", "ü/ä", "!", "!Lg", `a\b`,
	strings.Repeat("/", 200), strings.Repeat(".", 200), strings.Repeat("é", 100)}

// pushOdd pushes, for each odd name, a job of that ID to the topic of
// that name, due in an hour.
func pushOdd(t *testing.T, q *delayqueue.DelayQueue) {
	t.Helper()
	for _, name := range oddNames {
		_, err := q.Push(context.Background(), &delayqueue.Job{ID: name, Topic: name, Body: []byte("odd"), Delay: time.Hour})
		require.NoError(t, err, "%q", name)
	}
}

// TestEveryFormLeadsBack submits every form of every page, as a browser
// does, under prefixes however mounted: each leads to its page (Remove,
// to the job's topic in the job's state), which is there.
func TestEveryFormLeadsBack(t *testing.T) {
	for _, m := range mountings {
		for _, prefix := range []string{"", "/admin/queue", "/ops/dq-1"} {
			t.Run(m.name+"/prefix="+prefix, func(t *testing.T) {
				ctx := context.Background()
				q := newQueue(t, redistest.Shared(t).Client(t))
				ids := seed(t, q)
				kill(t, q, "mail", 2)
				pushOdd(t, q)
				mux := http.NewServeMux()
				m.mount(mux, prefix, q)
				s := serveMux(t, mux, prefix)

				var pages []string
				for _, topic := range append([]string{"mail", "paused"}, oddNames...) {
					for _, state := range []string{"dead", "ready", "delayed", "reserved"} {
						pages = append(pages, topicPath(topic)+"?state="+state)
					}
				}
				for _, id := range append([]string{ids.dead, ids.reserved, ids.ready, ids.delayed}, oddNames...) {
					pages = append(pages, jobPath(id))
				}
				pages = append(pages, "/")
				sent := 0
				for _, page := range pages {
					code, body := s.get(page)
					require.Equal(t, http.StatusOK, code, page)
					all := forms(body)
					actions := make([]string, 0, len(all))
					for a := range all {
						actions = append(actions, a)
					}
					// The page's forms in turn, from the one page: those
					// that delete last.
					deletes := func(a string) bool { return strings.HasSuffix(a, "/remove") || strings.HasSuffix(a, "/purge-dead") }
					slices.SortFunc(actions, func(a, b string) int {
						if deletes(a) != deletes(b) {
							if deletes(a) {
								return 1
							}
							return -1
						}
						return strings.Compare(a, b)
					})
					for _, action := range actions {
						want := s.prefix + page
						if id, ok := strings.CutPrefix(page, "/jobs/"); ok && strings.HasSuffix(action, "/remove") {
							job, err := q.Get(ctx, oddOrPlain(id))
							require.NoError(t, err)
							want = s.prefix + topicPath(job.Topic) + "?state=" + job.State.String()
						}
						require.True(t, strings.HasPrefix(action, s.prefix+"/"), action)
						to := s.send(action[len(prefix):], all[action])
						require.Equal(t, want, to, "%s from %s", action, page)
						code, body := s.open(to)
						require.Equal(t, http.StatusOK, code, "%s from %s", to, page)
						require.NotContains(t, body, "Failed", "%s from %s", action, page)
						sent++
					}
				}
				assert.Greater(t, sent, 2*len(oddNames))
			})
		}
	}
}

// oddOrPlain reads an ID back from jobPath's segment.
func oddOrPlain(seg string) string {
	if b64, ok := strings.CutPrefix(seg, "!"); ok {
		b, _ := base64.RawURLEncoding.DecodeString(b64)
		return string(b)
	}
	s, _ := url.PathUnescape(seg)
	return s
}

var (
	topicRowRe = regexp.MustCompile(`(?s)<tr data-topic="([^"]*)">(.*?)</tr>`)
	delayedRe  = regexp.MustCompile(`<a href="([^"]*)" data-count="delayed">`)
	jobLinkRe  = regexp.MustCompile(`(?s)<tr data-job="([^"]*)">\s*<td><a href="([^"]*)">`)
	jobNameRe  = regexp.MustCompile(`<h1>Job <span class="name">([^<]*)</span>`)
)

// links returns the links of a page's rows, by the row's name: re's first
// group is the name, its second the link.
func links(re *regexp.Regexp, page string) map[string]string {
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		out[html.UnescapeString(m[1])] = html.UnescapeString(m[2])
	}
	return out
}

// TestOddNamesOpenAndRemove follows the links the pages show, as a user
// does, to each job whose ID (and topic) a path does not hold as it is,
// and removes it with its page's button.
func TestOddNamesOpenAndRemove(t *testing.T) {
	for _, prefix := range []string{"", "/admin/queue"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			ctx := context.Background()
			q := newQueue(t, redistest.Shared(t).Client(t))
			pushOdd(t, q)
			s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), prefix)
			code, overview := s.get("/")
			require.Equal(t, http.StatusOK, code)
			rows := map[string]string{}
			for _, m := range topicRowRe.FindAllStringSubmatch(overview, -1) {
				rows[html.UnescapeString(m[1])] = m[2]
			}
			for _, name := range oddNames {
				require.Contains(t, rows, name)
				m := delayedRe.FindStringSubmatch(rows[name])
				require.NotNil(t, m, "%q", name)
				topicPage := html.UnescapeString(m[1])
				code, page := s.open(topicPage)
				require.Equal(t, http.StatusOK, code, "%q: %s", name, topicPage)
				jobPage, ok := links(jobLinkRe, page)[name]
				require.True(t, ok, "%q is not listed on %s", name, topicPage)

				code, page = s.open(jobPage)
				require.Equal(t, http.StatusOK, code, "%q: %s", name, jobPage)
				shown := jobNameRe.FindStringSubmatch(page)
				require.NotNil(t, shown)
				assert.Equal(t, name, html.UnescapeString(shown[1]))
				remove := jobPage + "/remove"
				form, ok := forms(page)[remove]
				require.True(t, ok, "no Remove on %s", jobPage)
				require.Equal(t, topicPage, s.send(remove[len(prefix):], form), "%q", name)
				code, page = s.open(topicPage)
				require.Equal(t, http.StatusOK, code)
				assert.Contains(t, page, "Removed job "+html.EscapeString(name)+".")
				_, err := q.Get(ctx, name)
				assert.ErrorIs(t, err, delayqueue.ErrNotFound, "%q", name)
			}
		})
	}
}
