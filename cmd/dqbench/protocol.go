package main

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The layout scenarios (l, e, p) run the queue in processes of their own:
// the parent starts its own binary again as
//
//	dqbench -role producer|consumer|single -impl dq|min -queue q ...
//
// and talks to each such child over its standard streams. A child writes
// lines to stdout:
//
//	ready                            set up: consuming, or waiting for "go"
//	r <job> <received µs> <due ms> <early> <attempt>
//	                                 one delivery: the job's number, the Unix
//	                                 time it arrived, its due time, 1 when
//	                                 the queue reserved it before its due time
//	                                 on the server's clock, and which attempt
//	                                 it is (dq only; the minimal design's
//	                                 receipts say 0 and 0)
//	h <job> <start µs> <end µs>      one handler's span (consumers with -work)
//	{...}                            its childResult, the last line it writes
//
// and reads lines from stdin:
//
//	go <base ms>                     start pushing; base is the first due time
//	end of input                     stop: a consumer stops taking jobs,
//	                                 reports what it took and exits
//
// A consumer reports every delivery, also those after the parent stopped
// waiting, so nothing it received goes uncounted. A child that loses its
// parent sees its stdin end and stops; one that outlives -timeout stops too.
const (
	readyLine   = "ready"
	goPrefix    = "go "
	receiptMark = "r "
	spanMark    = "h "
)

// span is when one job's handler ran, as a consumer with -work reports it.
type span struct {
	job        int
	start, end time.Time
}

func appendSpan(b []byte, s span) []byte {
	b = append(b, spanMark...)
	b = strconv.AppendInt(b, int64(s.job), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, s.start.UnixMicro(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, s.end.UnixMicro(), 10)
	return append(b, '\n')
}

func parseSpan(line []byte) (span, error) {
	n, err := lineInts(line, spanMark, 3)
	if err != nil {
		return span{}, fmt.Errorf("bad span: %w", err)
	}
	return span{job: int(n[0]), start: time.UnixMicro(n[1]), end: time.UnixMicro(n[2])}, nil
}

// lineInts reads the k integers of a line that starts with mark.
func lineInts(line []byte, mark string, k int) ([]int64, error) {
	rest, ok := bytes.CutPrefix(line, []byte(mark))
	f := bytes.Fields(rest)
	if !ok || len(f) != k {
		return nil, fmt.Errorf("%q", line)
	}
	n := make([]int64, k)
	for i := range n {
		v, err := strconv.ParseInt(string(f[i]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		n[i] = v
	}
	return n, nil
}

// childResult is what a child reports when it is done.
type childResult struct {
	Pushed    int    `json:"pushed,omitempty"`
	PushStart int64  `json:"push_start_us,omitempty"` // Unix µs, before the first push
	PushEnd   int64  `json:"push_end_us,omitempty"`   // Unix µs, after the last
	Received  int    `json:"received,omitempty"`
	Retried   int    `json:"retried,omitempty"`            // Redis errors retried (-endure)
	Reserves  int    `json:"reserves,omitempty"`           // dq: reserve calls made
	Empty     int    `json:"empty_reserves,omitempty"`     // dq: reserve calls that found no job
	Unclaimed int    `json:"unclaimed_reserves,omitempty"` // dq: of those, calls that came only to claim signals or look for a lost one, and found another process there first
	Alone     int    `json:"alone_reserves,omitempty"`     // dq: of those, calls that carried no finish either: script calls for nothing
	Error     string `json:"error,omitempty"`
}

// receipt is one delivery a consumer reported.
type receipt struct {
	job     int
	at      time.Time
	due     time.Time
	early   bool
	attempt int // 1 for the first; 0 when the design does not say
}

// appendReceipt formats r as a receipt line, newline included.
func appendReceipt(b []byte, r receipt) []byte {
	b = append(b, receiptMark...)
	b = strconv.AppendInt(b, int64(r.job), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, r.at.UnixMicro(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, r.due.UnixMilli(), 10)
	if r.early {
		b = append(b, " 1 "...)
	} else {
		b = append(b, " 0 "...)
	}
	b = strconv.AppendInt(b, int64(r.attempt), 10)
	return append(b, '\n')
}

// parseReceipt reads a receipt line, without its newline.
func parseReceipt(line []byte) (receipt, error) {
	n, err := lineInts(line, receiptMark, 5)
	if err != nil {
		return receipt{}, fmt.Errorf("bad receipt: %w", err)
	}
	return receipt{job: int(n[0]), at: time.UnixMicro(n[1]), due: time.UnixMilli(n[2]), early: n[3] == 1, attempt: int(n[4])}, nil
}

// jobBody is the 128-byte body of a layout job, the same for both designs:
// its due time in Unix milliseconds and its number, in decimal, then
// padding. The number lets the parent tell a duplicate from another job
// across consumer processes.
func jobBody(job int, due int64) []byte {
	b := make([]byte, 0, bodySize)
	b = strconv.AppendInt(b, due, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(job), 10)
	b = append(b, ' ')
	for len(b) < bodySize {
		b = append(b, 'x')
	}
	return b
}

// parseBody reads the job number and due time (Unix ms) from a jobBody.
func parseBody(b []byte) (job int, due int64, err error) {
	dueText, rest, ok1 := bytes.Cut(b, []byte{' '})
	jobText, _, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 {
		return 0, 0, errors.New("body without due time and job number")
	}
	if due, err = strconv.ParseInt(string(dueText), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("body: %w", err)
	}
	if job, err = strconv.Atoi(string(jobText)); err != nil {
		return 0, 0, fmt.Errorf("body: %w", err)
	}
	return job, due, nil
}
