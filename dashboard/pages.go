package dashboard

import (
	"html/template"
	"net/http"
	"slices"
	"time"

	"github.com/dqueue/delayqueue"
)

// The pages: the overview, a topic's, a job's.

// overviewData is the overview page's.
type overviewData struct {
	Topics  []topicRow
	Total   delayqueue.Counts
	Jobs    int
	Buckets int
	Charts  []template.HTML
	At      time.Time // when the figures were read
}

// topicRow is a topic's line in the overview.
type topicRow struct {
	Name string
	delayqueue.Counts
	Paused bool
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request, prefix string) {
	snap, err := h.overviews.get(r.Context())
	if err != nil {
		h.fail(w, r, prefix, status(err), err)
		return
	}
	data := overviewData{Total: snap.Total, Jobs: snap.Jobs, Buckets: snap.Buckets, Charts: h.history.charts(), At: snap.at}
	for _, name := range snap.names {
		data.Topics = append(data.Topics, topicRow{Name: name, Counts: snap.Topics[name], Paused: snap.paused[name]})
	}
	v := h.view(w, r, prefix, "Overview")
	v.Data = data
	h.render(w, http.StatusOK, "overview", v)
}

// topicData is a topic page's.
type topicData struct {
	Name   string
	Counts delayqueue.Counts
	Paused bool
	State  string
	States []string
	Jobs   []*delayqueue.Job
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
		paused, err := h.q.PausedTopics(ctx)
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		data.Paused = slices.Contains(paused, name)
		page, err := h.q.List(ctx, name, state, delayqueue.ListOptions{Cursor: data.Cursor, Limit: h.opts.PageSize})
		if err != nil {
			h.fail(w, r, prefix, status(err), err)
			return
		}
		data.Jobs, data.Next = page.Jobs, page.Next
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
