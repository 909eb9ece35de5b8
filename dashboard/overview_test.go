package dashboard_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"testing"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// topicsQueue is a queue whose Overview holds the topics given, each with
// one ready job; it has nothing else.
type topicsQueue struct {
	dashboard.Queue
	ov delayqueue.Overview
}

func newTopicsQueue(names ...string) topicsQueue {
	ov := delayqueue.Overview{Topics: map[string]delayqueue.Counts{}, Buckets: 8, Jobs: len(names)}
	for _, name := range names {
		ov.Topics[name] = delayqueue.Counts{Ready: 1}
	}
	ov.Total.Ready = len(names)
	return topicsQueue{ov: ov}
}

func (q topicsQueue) Overview(context.Context) (delayqueue.Overview, error) { return q.ov, nil }

var pageLink = regexp.MustCompile(`<a href="([^"]*)" rel="(next|prev)">`)

// listed returns the topics an overview page lists, and its next and
// previous pages' addresses.
func listed(t *testing.T, s *site, addr string) (topics []string, next, prev string) {
	t.Helper()
	code, page := s.open(addr)
	require.Equal(t, http.StatusOK, code, page)
	for _, m := range topicRowRe.FindAllStringSubmatch(page, -1) {
		topics = append(topics, html.UnescapeString(m[1]))
	}
	for _, m := range pageLink.FindAllStringSubmatch(page, -1) {
		if m[2] == "next" {
			next = html.UnescapeString(m[1])
		} else {
			prev = html.UnescapeString(m[1])
		}
	}
	return topics, next, prev
}

func TestOverviewPages(t *testing.T) {
	var names []string
	for i := range 230 {
		names = append(names, fmt.Sprintf("t-%03d", i))
	}
	for i := range 20 {
		names = append(names, fmt.Sprintf("u/%02d", i))
	}
	s := serve(t, dashboard.New(newTopicsQueue(names...), dashboard.Options{Logger: discard}), "/q")

	// Forward, a hundred at a time, then back.
	var got []string
	var visited []string
	for addr := "/q/"; addr != ""; {
		require.Less(t, len(visited), 10, "no end to the pages")
		visited = append(visited, addr)
		topics, next, _ := listed(t, s, addr)
		assert.LessOrEqual(t, len(topics), 100)
		got = append(got, topics...)
		addr = next
	}
	assert.Equal(t, names, got)
	require.Len(t, visited, 3)
	last, _, prev := listed(t, s, visited[2])
	assert.Equal(t, names[200:], last)
	middle, _, prev := listed(t, s, prev)
	assert.Equal(t, names[100:200], middle)
	first, _, prev := listed(t, s, prev)
	assert.Equal(t, names[:100], first)
	assert.Empty(t, prev)

	// By the start of their names, paged too.
	code, page := s.get("/")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `name="prefix"`, "a filter, for more topics than a page")
	assert.Contains(t, page, "<b>250</b> ready", "the totals of every topic")
	topics, next, _ := listed(t, s, "/q/?prefix=u%2F")
	assert.Equal(t, names[230:], topics)
	assert.Empty(t, next)
	topics, next, _ = listed(t, s, "/q/?prefix=t-1")
	assert.Equal(t, names[100:200], topics)
	assert.Empty(t, next)
	topics, _, _ = listed(t, s, "/q/?prefix=t-2&after=t-219")
	assert.Equal(t, names[220:230], topics)
	_, page = s.get("/?prefix=x")
	assert.Contains(t, page, "No topic starts with that.")
}

// TestOverviewOfManyTopicsIsSmall: with 10,000 topics, the overview lists
// a page of them.
func TestOverviewOfManyTopicsIsSmall(t *testing.T) {
	var names []string
	for i := range 10_000 {
		names = append(names, fmt.Sprintf("topic-%05d", i))
	}
	s := serve(t, dashboard.New(newTopicsQueue(names...), dashboard.Options{Logger: discard}), "")
	code, page := s.get("/")
	require.Equal(t, http.StatusOK, code)
	assert.Len(t, topicRowRe.FindAllString(page, -1), 100)
	assert.Contains(t, page, "Topics: 10000")
	assert.Less(t, len(page), 200<<10)
}
