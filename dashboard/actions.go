package dashboard

import (
	"errors"
	"fmt"
	"net/http"
)

// The actions: each a POST from one of the dashboard's forms, answered
// with a redirect (303) to the page its form names in "back", which shows
// what was done.

// act checks an action's request, runs it, and redirects back with its
// message; an error that is the queue's, not the request's, is logged.
func (h *handler) act(w http.ResponseWriter, r *http.Request, prefix string, do func(*http.Request) (string, error)) {
	if h.opts.ReadOnly {
		h.fail(w, r, prefix, http.StatusForbidden, errors.New("the dashboard is read-only"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := h.csrf.check(r); err != nil {
		h.fail(w, r, prefix, http.StatusForbidden, err)
		return
	}
	msg, err := do(r)
	if err != nil {
		code := status(err)
		if code >= 500 {
			h.log.Error("dashboard: "+r.URL.Path, "error", err)
		}
		msg = "Failed: " + err.Error()
	}
	h.overviews.drop()
	setFlash(w, r, prefix, msg)
	// Not http.Redirect, which would clean the path.
	w.Header().Set("Location", backTo(prefix, r.PostFormValue("back")))
	w.WriteHeader(http.StatusSeeOther)
}

// topicAction is an action on a topic.
func (h *handler) topicAction(topic, action string) func(*http.Request) (string, error) {
	switch action {
	case "pause":
		return func(r *http.Request) (string, error) {
			return fmt.Sprintf("Paused %s.", topic), h.q.Pause(r.Context(), topic)
		}
	case "resume":
		return func(r *http.Request) (string, error) {
			return fmt.Sprintf("Resumed %s.", topic), h.q.Resume(r.Context(), topic)
		}
	case "requeue-dead":
		return func(r *http.Request) (string, error) {
			n, err := h.q.RequeueAllDead(r.Context(), topic)
			return fmt.Sprintf("Requeued %d dead jobs of %s.", n, topic), err
		}
	case "purge-dead":
		return func(r *http.Request) (string, error) {
			n, err := h.q.PurgeDead(r.Context(), topic)
			return fmt.Sprintf("Purged %d dead jobs of %s.", n, topic), err
		}
	}
	return nil
}

// jobAction is an action on a job.
func (h *handler) jobAction(id, action string) func(*http.Request) (string, error) {
	switch action {
	case "requeue":
		return func(r *http.Request) (string, error) {
			return fmt.Sprintf("Requeued job %s: it is ready.", id), h.q.RequeueDead(r.Context(), id)
		}
	case "remove":
		return func(r *http.Request) (string, error) {
			return fmt.Sprintf("Removed job %s.", id), h.q.Remove(r.Context(), id)
		}
	}
	return nil
}
