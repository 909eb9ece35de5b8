// Package dashboard is a web page for a delay queue: an http.Handler a
// service mounts under a prefix of its own server, to see what the queue
// holds and to act on it.
//
//	mux.Handle("/admin/queue/", http.StripPrefix("/admin/queue", dashboard.New(q, dashboard.Options{})))
//
// It shows an overview (each topic's jobs per state, the age of its oldest
// ready job, whether it is paused, a hundred topics a page; the periodic
// schedules with their next and last tick; and charts of the last minutes),
// a page per topic listing its jobs by state a page at a time, and a page
// per job (its fields, headers, last error and body). Its buttons pause and
// resume a topic, requeue or purge dead letters, and remove a job. The
// overview's figures are read from Redis at most every 2 s (longer when
// reading them takes long), once for all who look.
//
// The pages are rendered on the server with html/template, which escapes
// every topic, ID, header, error and body; a body that is not printable
// text is shown as a hex dump. The stylesheet and the little script (an
// auto-refresh switch, a confirmation before purging) are embedded files:
// there is no front-end build, and the Content-Security-Policy allows no
// inline script. Every action is a POST carrying a token tied to a cookie
// (SameSite=Strict, HttpOnly) and is refused when the browser says it comes
// from another site; Options.ReadOnly hides the buttons and refuses every
// action. The dashboard has no login of its own: mount it behind the
// authentication the service already has.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/dqueue/delayqueue"
)

// Queue is what the dashboard uses of a queue: *delayqueue.DelayQueue
// has every method. Each must be safe for concurrent use. A Queue that
// also has Schedules(ctx) ([]delayqueue.Schedule, error), as
// *delayqueue.DelayQueue does, has its periodic schedules listed on the
// overview.
type Queue interface {
	Overview(ctx context.Context) (delayqueue.Overview, error)
	Counts(ctx context.Context, topic string) (delayqueue.Counts, error)
	List(ctx context.Context, topic string, state delayqueue.State, opts delayqueue.ListOptions) (delayqueue.JobPage, error)
	Get(ctx context.Context, id string) (*delayqueue.Job, error)
	Remove(ctx context.Context, id string) error
	RequeueDead(ctx context.Context, id string) error
	RequeueAllDead(ctx context.Context, topic string) (int, error)
	PurgeDead(ctx context.Context, topic string) (int, error)
	Pause(ctx context.Context, topic string) error
	Resume(ctx context.Context, topic string) error
}

// Options configure a dashboard. The zero value is a working dashboard
// with every action allowed.
type Options struct {
	// ReadOnly hides the buttons and refuses every action with 403
	// Forbidden.
	ReadOnly bool
	// Prefix is the path the dashboard is mounted under, such as
	// "/admin/queue", for its links, forms and cookies. Default: found
	// from each request, as the part of its path that http.StripPrefix
	// took away; set it when a proxy in front rewrites paths. Keep it to
	// ASCII letters, digits, "-_.~" and "/": http.StripPrefix compares a
	// prefix with the escaped path too, which spells any other character
	// as %XX.
	Prefix string
	// Logger receives the errors of Redis that pages meet. Default:
	// slog.Default().
	Logger *slog.Logger
	// PageSize is how many jobs a topic page lists. Default: 50.
	PageSize int
	// Meter, when also given to the queue with delayqueue.WithObserver,
	// adds a throughput chart to the overview. Default: none.
	Meter *Meter
	// FormKey signs the forms' tokens against cross-site requests: give
	// every replica behind one address the same key, of at least 32
	// random bytes kept secret, and a form one shows is taken by any.
	// Default: a random key of the handler's own, so that a form shown by
	// one process is refused by another.
	FormKey []byte
}

// scheduleLister is the method a Queue may have to list its schedules.
type scheduleLister interface {
	Schedules(ctx context.Context) ([]delayqueue.Schedule, error)
}

// minFormKey is the shortest Options.FormKey.
const minFormKey = 32

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// handler is the dashboard: see New.
type handler struct {
	q       Queue
	opts    Options
	log     *slog.Logger
	csrf    csrfKey
	history *history
	// overviews keeps the last Overview a moment (cache.go).
	overviews *overviewCache
	pages     map[string]*template.Template
	static    fs.FS
}

// New returns the dashboard of q as an http.Handler, to mount under a
// prefix with http.StripPrefix (or at the root of a server). It is safe
// for concurrent use. Unless Options.FormKey is set, each handler signs
// its forms with a key of its own, made here: a form shown by one process
// is refused by another. New panics when FormKey is set but shorter than
// 32 bytes.
func New(q Queue, opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 50
	}
	opts.Prefix = strings.TrimSuffix(opts.Prefix, "/")
	key := newCSRFKey()
	if opts.FormKey != nil {
		if len(opts.FormKey) < minFormKey {
			panic(fmt.Sprintf("dashboard: Options.FormKey holds %d bytes; it needs at least %d", len(opts.FormKey), minFormKey))
		}
		key = csrfKey(bytes.Clone(opts.FormKey))
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded folder exists
	}
	h := &handler{
		q:       q,
		opts:    opts,
		log:     opts.Logger,
		csrf:    key,
		history: newHistory(opts.Meter),
		pages:   parsePages(),
		static:  static,
	}
	h.overviews = newOverviewCache(func(ctx context.Context) (figures, error) {
		ov, err := q.Overview(ctx)
		if err != nil {
			return figures{}, err
		}
		h.history.add(ov)
		fig := figures{Overview: ov}
		if l, ok := q.(scheduleLister); ok {
			fig.Schedules, err = l.Schedules(ctx)
		}
		return fig, err
	})
	return h
}

// parsePages parses each page with the layout around it.
func parsePages() map[string]*template.Template {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "topic", "job", "error"} {
		pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return pages
}

// ServeHTTP routes a request by its path, whose segments are unescaped one
// by one; a topic or an ID is one segment (paths.go).
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "same-origin")
	hdr.Set("X-Frame-Options", "DENY")

	prefix := h.opts.Prefix
	if prefix == "" {
		prefix = prefixOf(r)
	}
	segs, ok := segments(r.URL.EscapedPath())
	if !ok {
		h.fail(w, r, prefix, http.StatusBadRequest, errors.New("bad path"))
		return
	}
	rt := route{prefix: prefix}
	switch {
	case len(segs) == 0:
		rt.get = h.overview
	case len(segs) == 2 && segs[0] == "static":
		rt.get = h.serveStatic(segs[1])
	case (len(segs) == 2 || len(segs) == 3) && (segs[0] == "topics" || segs[0] == "jobs"):
		name, ok := unsegment(segs[1])
		if !ok {
			h.fail(w, r, prefix, http.StatusBadRequest, errors.New("bad path"))
			return
		}
		switch {
		case len(segs) == 2 && segs[0] == "topics":
			rt.get = h.topic(name)
		case len(segs) == 3 && segs[0] == "topics":
			rt.post = h.topicAction(name, segs[2])
		case len(segs) == 2:
			rt.get = h.job(name)
		default:
			rt.post = h.jobAction(name, segs[2])
		}
	}
	h.serve(w, r, rt)
}

// A route is what a path leads to: a page (GET and HEAD), or an action
// (POST), with the prefix of the request's links.
type route struct {
	prefix string
	get    func(w http.ResponseWriter, r *http.Request, prefix string)
	post   func(r *http.Request) (flash string, err error)
}

// serve runs a route for the request's method: 404 for an unknown path,
// 405 for the wrong method.
func (h *handler) serve(w http.ResponseWriter, r *http.Request, rt route) {
	switch {
	case rt.get == nil && rt.post == nil:
		h.fail(w, r, rt.prefix, http.StatusNotFound, errors.New("no such page"))
	case rt.get != nil && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		rt.get(w, r, rt.prefix)
	case rt.post != nil && r.Method == http.MethodPost:
		h.act(w, r, rt.prefix, rt.post)
	default:
		allow := "GET, HEAD"
		if rt.post != nil {
			allow = "POST"
		}
		w.Header().Set("Allow", allow)
		h.fail(w, r, rt.prefix, http.StatusMethodNotAllowed, errors.New("method not allowed"))
	}
}

// serveStatic serves an embedded asset.
func (h *handler) serveStatic(name string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, prefix string) {
		if _, err := fs.Stat(h.static, name); err != nil || strings.Contains(name, "..") {
			h.fail(w, r, prefix, http.StatusNotFound, errors.New("no such file"))
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=300")
		http.ServeFileFS(w, r, h.static, name)
	}
}

// status is the HTTP status for an error of the queue: 400 for what the
// request got wrong, 404 for a job that is not there, 500 for the rest.
func status(err error) int {
	switch {
	case errors.Is(err, delayqueue.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, delayqueue.ErrInvalidTopic), errors.Is(err, delayqueue.ErrInvalidID),
		errors.Is(err, delayqueue.ErrInvalidCursor), errors.Is(err, delayqueue.ErrInvalidState),
		errors.Is(err, delayqueue.ErrInvalidLimit):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// fail renders the error page; a server error is logged.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, prefix string, code int, err error) {
	if code >= 500 {
		h.log.Error("dashboard: "+r.Method+" "+r.URL.Path, "error", err)
	}
	v := h.view(w, r, prefix, http.StatusText(code))
	v.Data = err.Error()
	if code >= 500 {
		v.Data = "Redis did not answer as expected; the details are in the server's log."
	}
	h.render(w, code, "error", v)
}

// render executes a page's template and sends it with the status code.
func (h *handler) render(w http.ResponseWriter, code int, page string, v *view) {
	var b bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&b, "layout", v); err != nil {
		h.log.Error("dashboard: render "+page, "error", err)
		http.Error(w, "cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}
