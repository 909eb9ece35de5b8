package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/internal/visible"
)

// printJSON writes v as one indented JSON document.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns; Flush prints them.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

// row adds a row; its cells must hold no tab or newline (see escape).
func (t *table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// escape shows s on one line (see visible.Escape), cut to at most n runes
// with "…".
func escape(s string, n int) string {
	if utf8.RuneCountInString(s) > n {
		return visible.Escape(string([]rune(s)[:n])) + "…" // invalid bytes become U+FFFD
	}
	return visible.Escape(s)
}

// bodyPreview is the start of a body for a table: escaped text, or hex.
func bodyPreview(b []byte, n int) string {
	if printable(b) {
		return escape(string(b), n)
	}
	h := fmt.Sprintf("%x", b[:min(len(b), n/2)])
	if len(b) > n/2 {
		h += "…"
	}
	return "0x" + h
}

// printable reports whether b is UTF-8 text a terminal shows as it is.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	s := string(b)
	for i, r := range s {
		switch {
		case r == '\r':
			// Only as part of a CRLF: alone, it takes the cursor back
			// over what the line showed.
			if !strings.HasPrefix(s[i+1:], "\n") {
				return false
			}
		case !unicode.IsPrint(r) && r != '\n' && r != '\t':
			return false
		}
	}
	return true
}

// relative says when t is from now, for people: "in 29m59s", "3s ago",
// "-" for the zero time.
func relative(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", t.Local().Format("2006-01-02 15:04:05"), span(t.Sub(now)))
}

// span reads a signed duration from now: "in 1m30s", "3s ago", "now".
func span(d time.Duration) string {
	switch a := roundHuman(d.Abs()); {
	case a == 0:
		return "now"
	case d > 0:
		return "in " + a.String()
	default:
		return a.String() + " ago"
	}
}

// roundHuman rounds a duration to what a person reads: whole seconds, or
// milliseconds under a second.
func roundHuman(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// age shows a duration that is a wait, "-" when there is none.
func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return roundHuman(d).String()
}

// rfc3339 is a time for JSON: RFC 3339 in UTC, "" for the zero time.
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// jobJSON is a job as --json prints it.
type jobJSON struct {
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	State         string            `json:"state"`
	Due           string            `json:"due,omitempty"`            // delayed and ready jobs
	ReservedUntil string            `json:"reserved_until,omitempty"` // reserved jobs
	DiedAt        string            `json:"died_at,omitempty"`        // dead jobs
	Attempts      int               `json:"attempts"`
	MaxAttempts   int               `json:"max_attempts"`
	TTRMillis     int64             `json:"ttr_ms"`
	LastError     string            `json:"last_error,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Body          *string           `json:"body,omitempty"`        // when the body is UTF-8 text
	BodyBase64    []byte            `json:"body_base64,omitempty"` // otherwise
}

func toJSON(j *delayqueue.Job) jobJSON {
	out := jobJSON{
		ID: j.ID, Topic: j.Topic, State: j.State.String(),
		ReservedUntil: rfc3339(j.ReservedUntil), DiedAt: rfc3339(j.DiedAt),
		Attempts: j.Attempts, MaxAttempts: j.MaxAttempts, TTRMillis: j.TTR.Milliseconds(),
		LastError: j.LastError, Headers: j.Headers,
	}
	if j.State == delayqueue.StateDelayed || j.State == delayqueue.StateReady {
		out.Due = rfc3339(j.RunAt)
	}
	if utf8.Valid(j.Body) {
		s := string(j.Body)
		out.Body = &s
	} else {
		out.BodyBase64 = j.Body
	}
	return out
}

// when is the time that matters for a job in its state, and its name.
func when(j *delayqueue.Job) (string, time.Time) {
	switch j.State {
	case delayqueue.StateReserved:
		return "deadline", j.ReservedUntil
	case delayqueue.StateDead:
		return "died", j.DiedAt
	}
	return "due", j.RunAt
}
