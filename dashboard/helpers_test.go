package dashboard_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

var nameSeq atomic.Int64

// newQueue opens a queue of its own on c, closed when the test ends.
func newQueue(t *testing.T, c redis.UniversalClient, opts ...delayqueue.Option) *delayqueue.DelayQueue {
	t.Helper()
	opts = append([]delayqueue.Option{delayqueue.WithName(fmt.Sprintf("dashboard-%d", nameSeq.Add(1))), delayqueue.WithLogger(discard)}, opts...)
	q, err := delayqueue.New(c, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close(context.Background()) })
	return q
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// The markup the escaping tests try to inject.
const (
	scriptTag = `<script>alert(1)</script>`
	imgTag    = `"'><img src=x onerror=alert(1)>`
)

// seeded is the IDs of the jobs seed pushed, one per state.
type seeded struct {
	delayed, ready, reserved, dead, script, binary string
}

// seed pushes to topic "mail" a job in every state (the dead one with
// LastError imgTag), a ready job whose body is scriptTag and headers hold
// imgTag, and one with a binary body; and pauses topic "paused", which
// holds one delayed job.
func seed(t *testing.T, q *delayqueue.DelayQueue) seeded {
	t.Helper()
	ctx := context.Background()
	push := func(j *delayqueue.Job) string {
		id, err := q.Push(ctx, j)
		require.NoError(t, err)
		return id
	}
	var s seeded
	s.dead = push(&delayqueue.Job{Topic: "mail", Body: []byte("will die"), MaxAttempts: 1})
	job, err := q.Pop(ctx, "mail", 0)
	require.NoError(t, err)
	require.NoError(t, q.Retry(ctx, job, errors.New(imgTag)))
	s.reserved = push(&delayqueue.Job{Topic: "mail", Body: []byte("in hand"), TTR: time.Hour})
	_, err = q.Pop(ctx, "mail", 0)
	require.NoError(t, err)
	s.ready = push(&delayqueue.Job{Topic: "mail", Body: []byte("hello, world")})
	s.script = push(&delayqueue.Job{Topic: "mail", Body: []byte(scriptTag + "\n" + imgTag), Headers: map[string]string{"x-evil": imgTag}})
	s.binary = push(&delayqueue.Job{Topic: "mail", Body: []byte{0, 1, 2, 0xff, 'h', 'i'}})
	s.delayed = push(&delayqueue.Job{Topic: "mail", Body: []byte("later"), Delay: time.Hour})
	push(&delayqueue.Job{Topic: "paused", Body: []byte("held"), Delay: time.Hour})
	require.NoError(t, q.Pause(ctx, "paused"))
	return s
}

// site is a dashboard served under a prefix, and a browser-like client
// that keeps cookies and does not follow redirects.
type site struct {
	t      *testing.T
	srv    *httptest.Server
	prefix string
	client *http.Client
}

// serve mounts d under prefix ("" for the root) as a user would, with
// http.StripPrefix on a ServeMux.
func serve(t *testing.T, d http.Handler, prefix string) *site {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, d))
	return serveMux(t, mux, prefix)
}

// serveMux serves mux, which has a dashboard under prefix.
func serveMux(t *testing.T, mux *http.ServeMux, prefix string) *site {
	t.Helper()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(client.CloseIdleConnections)
	return &site{t: t, srv: srv, prefix: prefix, client: client}
}

// get fetches path (below the prefix) and returns the status and body.
func (s *site) get(path string) (int, string) {
	s.t.Helper()
	resp, err := s.client.Get(s.srv.URL + s.prefix + path)
	require.NoError(s.t, err)
	return readAll(s.t, resp)
}

func readAll(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token reads the form token of a page below the prefix.
func (s *site) token(page string) string {
	s.t.Helper()
	code, body := s.get(page)
	require.Equal(s.t, http.StatusOK, code, body)
	m := csrfInput.FindStringSubmatch(body)
	require.NotNil(s.t, m, "no form token on %s", page)
	return m[1]
}

// post sends an action as the dashboard's form does, with the headers
// given (name, value, ...), and returns the response, its body read.
func (s *site) post(action string, form url.Values, headers ...string) (*http.Response, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+s.prefix+action, strings.NewReader(form.Encode()))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.client.Do(req)
	require.NoError(s.t, err)
	_, body := readAll(s.t, resp)
	return resp, body
}

// open fetches an address as a page writes it, the prefix included.
func (s *site) open(addr string) (int, string) {
	s.t.Helper()
	require.True(s.t, strings.HasPrefix(addr, s.prefix+"/"), "%s is not below %s", addr, s.prefix)
	return s.get(addr[len(s.prefix):])
}

var (
	postForm    = regexp.MustCompile(`(?s)<form method="post" action="([^"]*)"[^>]*>(.*?)</form>`)
	hiddenInput = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// forms returns the actions of a page's forms, as the page writes them,
// and the fields of each.
func forms(page string) map[string]url.Values {
	out := map[string]url.Values{}
	for _, m := range postForm.FindAllStringSubmatch(page, -1) {
		fields := url.Values{}
		for _, in := range hiddenInput.FindAllStringSubmatch(m[2], -1) {
			fields.Set(in[1], html.UnescapeString(in[2]))
		}
		out[html.UnescapeString(m[1])] = fields
	}
	return out
}

// formOf returns the fields of the form of page (below the prefix) whose
// action is action (below the prefix).
func (s *site) formOf(page, action string) url.Values {
	s.t.Helper()
	code, body := s.get(page)
	require.Equal(s.t, http.StatusOK, code, body)
	form, ok := forms(body)[s.prefix+action]
	require.True(s.t, ok, "no form for %s on %s", action, page)
	return form
}

// send posts a form as a browser does from one of the dashboard's pages
// and returns the address it redirects to.
func (s *site) send(action string, form url.Values) string {
	s.t.Helper()
	resp, body := s.post(action, form, "Origin", s.srv.URL, "Sec-Fetch-Site", "same-origin")
	require.Equal(s.t, http.StatusSeeOther, resp.StatusCode, body)
	return resp.Header.Get("Location")
}

// submit sends the form of page for action, with the fields the page
// gave it, and returns the address it redirects to.
func (s *site) submit(page, action string) string {
	s.t.Helper()
	return s.send(action, s.formOf(page, action))
}

// act submits the form of page for action, checks that it leads back to
// page, and returns that page as it shows then.
func (s *site) act(page, action string) string {
	s.t.Helper()
	return s.actTo(page, action, page)
}

// actTo is act for a form that leads to another page, landing.
func (s *site) actTo(page, action, landing string) string {
	s.t.Helper()
	require.Equal(s.t, s.prefix+landing, s.submit(page, action))
	code, after := s.get(landing)
	require.Equal(s.t, http.StatusOK, code, after)
	return after
}

// topicPath and jobPath are the pages' paths: a topic or an ID is itself,
// percent-encoded, or when it is "." or "..", holds '/', '\' or '%', or
// begins with '!', '!' and its base64url.
func topicPath(topic string) string { return "/topics/" + pathSegment(topic) }
func jobPath(id string) string      { return "/jobs/" + pathSegment(id) }

func pathSegment(name string) string {
	if name == "." || name == ".." || strings.HasPrefix(name, "!") || strings.ContainsAny(name, `/\%`) {
		return "!" + base64.RawURLEncoding.EncodeToString([]byte(name))
	}
	return url.PathEscape(name)
}
