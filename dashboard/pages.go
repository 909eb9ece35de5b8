package dashboard

import (
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dqueue/delayqueue"
)

// The pages: the overview, a topic's, a job's.

// topicsPerPage is how many topics the overview lists at a time.
const topicsPerPage = 100

// overviewData is the overview page's.
type overviewData struct {
	Topics    []topicRow
	Schedules []delayqueue.Schedule
	Total     delayqueue.Counts
	Jobs      int
	Buckets   int
	Charts    chartsData
	At        time.Time // when the figures were read
	// TopicCount is how many topics there are; Matching, how many start
	// with NamePrefix. The page lists From+1 to From+len(Topics) of them.
	TopicCount, Matching, From int
	NamePrefix                 string
	// First, Prev and Next are the addresses of the first, previous and
	// next pages: "" for none.
	First, Prev, Next string
}

// Filter tells whether the page shows the filter by name: when the
// topics take more than a page, or a filter is set.
func (d overviewData) Filter() bool { return d.TopicCount > topicsPerPage || d.NamePrefix != "" }

// Until is the number of the last topic the page lists.
func (d overviewData) Until() int { return d.From + len(d.Topics) }

// topicRow is a topic's line in the overview.
type topicRow struct {
	Name string
	delayqueue.Counts
	Paused bool
	Limit  *delayqueue.LimitUsage // nil: no limits
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request, prefix string) {
	snap, err := h.overviews.get(r.Context())
	if err != nil {
		h.fail(w, r, prefix, status(err), err)
		return
	}
	query := r.URL.Query()
	namePrefix, after, before := query.Get("prefix"), query.Get("after"), query.Get("before")
	from, to, lo, hi := snap.page(namePrefix, after, before, topicsPerPage)
	v := h.view(w, r, prefix, "Overview")
	v.Here = v.Overview(namePrefix, after, before)
	data := overviewData{
		Total: snap.Total, Jobs: snap.Jobs, Buckets: snap.Buckets, Charts: charts(snap.History), At: snap.at, Schedules: snap.Schedules,
		TopicCount: len(snap.names), Matching: hi - lo, From: from - lo, NamePrefix: namePrefix,
	}
	for _, name := range snap.names[from:to] {
		row := topicRow{Name: name, Counts: snap.Topics[name], Paused: snap.paused[name]}
		if u, ok := snap.Limits[name]; ok {
			row.Limit = &u
		}
		data.Topics = append(data.Topics, row)
	}
	if from > lo {
		data.First, data.Prev = v.Overview(namePrefix, "", ""), v.Overview(namePrefix, "", snap.names[from])
	}
	if to < hi {
		data.Next = v.Overview(namePrefix, snap.names[to-1], "")
	}
	v.Data = data
	h.render(w, http.StatusOK, "overview", v)
}

// page finds the topics an overview page lists, names[from:to], among
// those starting with namePrefix, names[lo:hi]: the n after the name
// after, else the n before the name before, else the first n.
func (s *snapshot) page(namePrefix, after, before string, n int) (from, to, lo, hi int) {
	names := s.names
	lo, _ = slices.BinarySearch(names, namePrefix)
	hi = lo + sort.Search(len(names)-lo, func(i int) bool { return !strings.HasPrefix(names[lo+i], namePrefix) })
	from = lo
	switch {
	case after != "":
		i, found := slices.BinarySearch(names, after)
		if found {
			i++
		}
		from = min(max(i, lo), hi)
	case before != "":
		i, _ := slices.BinarySearch(names, before)
		from = max(min(i, hi)-n, lo)
	}
	return from, min(from+n, hi), lo, hi
}

// topicData is a topic page's.
type topicData struct {
	Name   string
	Counts delayqueue.Counts
	Paused bool
	State  string
	States []string
	Jobs   []*delayqueue.Job
	Charts chartsData
	// Cursor is the page's cursor ("" on the first) and Next the next
	// page's ("" on the last).
	Cursor, Next string
}

func (h *handler) topic(name string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, prefix string) {
		ctx := r.Context()
		state, err := parseState(r.URL.Query().Get("state"))
		if err != nil {
			h.fail(w, r, prefix, http.StatusBadRequest, err)
			return
		}
		data := topicData{Name: name, State: state.String(), Cursor: r.URL.Query().Get("cursor")}
		for _, s := range states {
			data.States = append(data.States, s.String())
		}
		data.Counts, err = h.q.Counts(ctx, name)
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		snap, err := h.overviews.get(ctx) // the paused topics, read at most once per freshFor
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		data.Paused = snap.paused[name]
		page, err := h.q.List(ctx, name, state, delayqueue.ListOptions{Cursor: data.Cursor, Limit: h.opts.PageSize})
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		data.Jobs, data.Next = page.Jobs, page.Next
		samples, err := history(ctx, h.q, name)
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		data.Charts = charts(samples)
		v := h.view(w, r, prefix, "Topic "+name)
		v.Here = v.TopicState(name, data.State, data.Cursor)
		v.Data = data
		h.render(w, http.StatusOK, "topic", v)
	}
}

// jobData is a job page's.
type jobData struct {
	Job     *delayqueue.Job
	State   string
	Headers []header
	Body    body
}

func (h *handler) job(id string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, prefix string) {
		job, err := h.q.Get(r.Context(), id)
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		v := h.view(w, r, prefix, "Job "+id)
		v.Here = v.Job(id)
		v.Data = jobData{Job: job, State: job.State.String(), Headers: sortedHeaders(job.Headers), Body: showBody(job.Body)}
		h.render(w, http.StatusOK, "job", v)
	}
}
