package dashboard

import (
	"encoding/base64"
	"encoding/hex"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/visible"
)

// view is what every page's template gets: the layout's fields, and the
// page's own in Data. Its methods build the addresses of the pages.
type view struct {
	Prefix   string
	Title    string
	CSRF     string
	ReadOnly bool
	Flash    string
	// Here is the page's address: where an action sent from it comes
	// back to.
	Here string
	Data any
}

// view starts a page's view: its form token, and the flash message an
// action left, which it clears.
func (h *handler) view(w http.ResponseWriter, r *http.Request, prefix, title string) *view {
	v := &view{Prefix: prefix, Title: visible.Escape(title), ReadOnly: h.opts.ReadOnly}
	v.Here = v.Home()
	if !h.opts.ReadOnly {
		v.CSRF = h.csrf.formToken(w, r, prefix)
	}
	if c, err := r.Cookie(flashCookie); err == nil {
		if b, err := base64.RawURLEncoding.DecodeString(c.Value); err == nil {
			v.Flash = visible.Escape(string(b))
		}
		http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: prefix + "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	return v
}

// flashCookie carries an action's message to the page it redirects to.
const flashCookie = "dq_dashboard_flash"

// setFlash leaves msg for the next page shown.
func setFlash(w http.ResponseWriter, r *http.Request, prefix, msg string) {
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(msg)), Path: prefix + "/",
		MaxAge: 60, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// The addresses of the pages: each the prefix and a path below it, with
// a topic or an ID as one segment (see segment).

// Home is the overview's address.
func (v *view) Home() string { return v.Prefix + "/" }

// Overview is the address of the overview's page listing the topics
// starting with namePrefix, after the name after or before the name
// before (both "" for the first page).
func (v *view) Overview(namePrefix, after, before string) string {
	q := url.Values{}
	for k, s := range map[string]string{"prefix": namePrefix, "after": after, "before": before} {
		if s != "" {
			q.Set(k, s)
		}
	}
	if len(q) == 0 {
		return v.Home()
	}
	return v.Home() + "?" + q.Encode()
}

// Static is the address of an embedded asset.
func (v *view) Static(name string) string { return v.Prefix + "/static/" + name }

// Topic is the address of a topic's page.
func (v *view) Topic(topic string) string { return v.Prefix + "/topics/" + segment(topic) }

// TopicState is the address of a topic's page listing the jobs in state,
// from cursor ("" for the first page).
func (v *view) TopicState(topic, state, cursor string) string {
	q := url.Values{"state": {state}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return v.Topic(topic) + "?" + q.Encode()
}

// Job is the address of a job's page.
func (v *view) Job(id string) string { return v.Prefix + "/jobs/" + segment(id) }

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"dur":  duration,
	"vis":  visible.Escape, // names, errors and headers: no control or bidi runes as they are
	"when": when,
	"list": func(a ...any) []any { return a },
	"add":  func(a, b int) int { return a + b },
}

// duration shows a length of time rounded for reading.
func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// when shows a time, and how far from now it is.
func when(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	d := time.Until(t)
	rel := "in " + duration(d)
	if d < 0 {
		rel = duration(-d) + " ago"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z") + " (" + rel + ")"
}

// maxShown bounds how much of a body the job page shows.
const maxShown = 64 << 10

// body is a job's body as the job page shows it: as text when it is
// printable UTF-8, else as a hex dump; cut at maxShown bytes.
type body struct {
	Size      int
	Text, Hex string
	Cut       bool
}

func showBody(b []byte) body {
	out := body{Size: len(b)}
	if len(b) > maxShown {
		b, out.Cut = b[:maxShown], true
	}
	if printable(b, out.Cut) {
		out.Text = string(b)
	} else {
		out.Hex = hex.Dump(b)
	}
	return out
}

// printable reports whether b is UTF-8 text with no control characters
// but newlines and tabs; cut allows a rune split at its end.
func printable(b []byte, cut bool) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return cut && !utf8.FullRune(b)
		}
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) || r == '\u2028' || r == '\u2029' {
			return false
		}
		b = b[n:]
	}
	return true
}

// header is one of a job's headers.
type header struct{ Key, Value string }

func sortedHeaders(h map[string]string) []header {
	out := make([]header, 0, len(h))
	for k, v := range h {
		out = append(out, header{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// states are the states a topic page lists, in the order of its tabs.
var states = []delayqueue.State{delayqueue.StateReady, delayqueue.StateDelayed, delayqueue.StateReserved, delayqueue.StateDead}

// parseState reads a state's name; "" is ready.
func parseState(s string) (delayqueue.State, error) {
	if s == "" {
		return delayqueue.StateReady, nil
	}
	return delayqueue.ParseState(s)
}
