package delayqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// queueFormat is what a queue's meta hash records as its "format", and
// New checks: 4 is jobs in job format 2, with headers (bit 6), counts per
// bucket (keys.go), and a ready job's place in its ready list where a
// reserved one keeps its reservation (lib/places.lua). A queue written in another
// format is refused (ErrFormatMismatch).
const queueFormat = 4

// The job encoding. A job is stored in the pool as a 22-byte header, then
// the optional fields its flags announce, then topic, last error, headers
// and body. Numbers are unsigned big-endian.
//
//	offset  size  field
//	 0      1     flags: bit 7 set (the format marker; bit 7 clear is an
//	              encoding this version does not know); bit 6 set when
//	              headers follow, bit 5 a push nonce, bit 4 a dedup window,
//	              bit 3 a last error; the State in the low 3 bits
//	 1      2     attempts (deliveries so far)
//	 3      2     max attempts
//	 5      4     ttr_ms
//	 9      6     at_ms: a reserved job's reservation deadline (its score
//	              in its bucket), a ready job's due time, when a dead job
//	              died; not read for a delayed job, whose due time is its
//	              score
//	15      6     reservation: the number of a reserved job's reservation,
//	              by which a consumer proves it still holds the job; a
//	              ready job's place in its ready list (lib/places.lua)
//	21      1     topic length
//	22      [2]   last error length, when bit 3 is set
//	        [4]   dedup window ms, when bit 4 is set
//	        [4]   push nonce, when bit 5 is set: random, it marks a job of a
//	              generated ID, so that a push re-sent by go-redis knows its
//	              own earlier run from another job
//	        [2]   headers length, when bit 6 is set
//	        ...   topic, last error, headers, body (the rest: any bytes)
//
// The headers are opaque to the scripts, which carry them over unread: each
// key and then its value, as a uvarint length and the bytes, keys in order
// (encodeHeaders). A job without headers has neither bit 6 nor a byte for
// them. A job of a 5-byte topic and a 128-byte body, with its push nonce,
// fits one 160-byte allocation of Redis's allocator. In Go, encodeJob writes
// the header and decodeJob reads it; in Lua, scripts/lib/header.lua writes
// it.
const (
	jobFormat     = 1 << 7 // the marker bit of an encoded job's first byte
	jobHasHeaders = 1 << 6
	jobHasNonce   = 1 << 5
	jobHasWindow  = 1 << 4
	jobHasError   = 1 << 3
	jobHeaderLen  = 22

	maxTTR         = (1<<32 - 1) * time.Millisecond // ttr_ms is 4 bytes
	maxMaxAttempts = 1<<16 - 1                      // max attempts is 2 bytes
	maxDedupWindow = (1<<32 - 1) * time.Millisecond // the window is 4 bytes
)

// encodeJob writes a new delayed job as push.lua stores it: no attempts, no
// reservation, no error, due at atMs (push.lua writes the due time of a delay),
// with a dedup window of windowMs, a push nonce (0: none of either) and
// headers as encodeHeaders wrote them (nil: none).
func encodeJob(topic string, body []byte, ttrMs int64, maxAttempts int, atMs, windowMs int64, nonce uint32, headers []byte) []byte {
	n := jobHeaderLen
	if windowMs > 0 {
		n += 4
	}
	if nonce != 0 {
		n += 4
	}
	if len(headers) > 0 {
		n += 2
	}
	v := make([]byte, jobHeaderLen, n+len(topic)+len(headers)+len(body))
	v[0] = jobFormat | byte(StateDelayed)
	binary.BigEndian.PutUint16(v[3:], uint16(maxAttempts))
	binary.BigEndian.PutUint32(v[5:], uint32(ttrMs))
	putUint48(v[9:], uint64(atMs))
	v[21] = byte(len(topic))
	if windowMs > 0 {
		v[0] |= jobHasWindow
		v = binary.BigEndian.AppendUint32(v, uint32(windowMs))
	}
	if nonce != 0 {
		v[0] |= jobHasNonce
		v = binary.BigEndian.AppendUint32(v, nonce)
	}
	if len(headers) > 0 {
		v[0] |= jobHasHeaders
		v = binary.BigEndian.AppendUint16(v, uint16(len(headers)))
	}
	v = append(v, topic...)
	v = append(v, headers...)
	return append(v, body...)
}

// encodeHeaders writes headers as a job's encoding carries them: each key
// and then its value, as a uvarint length and the bytes, keys in order so
// that equal headers encode alike; nil for none. Headers that
// validateHeaders accepts take at most 61,824 bytes, within the 2-byte
// length that announces them.
func encodeHeaders(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	size := 0
	for k, v := range h {
		keys = append(keys, k)
		size += len(k) + len(v) + 2*binary.MaxVarintLen32
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	for _, k := range keys {
		b = appendString(appendString(b, k), h[k])
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// decodeHeaders reads what encodeHeaders wrote.
func decodeHeaders(b []byte) (map[string]string, error) {
	h := map[string]string{}
	for len(b) > 0 {
		var kv [2]string
		for i := range kv {
			n, size := binary.Uvarint(b)
			if size <= 0 || uint64(len(b)-size) < n {
				return nil, errors.New("short headers")
			}
			kv[i], b = string(b[size:size+int(n)]), b[size+int(n):]
		}
		h[kv[0]] = kv[1]
	}
	return h, nil
}

func putUint48(b []byte, n uint64) {
	binary.BigEndian.PutUint16(b, uint16(n>>32))
	binary.BigEndian.PutUint32(b[2:], uint32(n))
}

func uint48(b []byte) int64 {
	return int64(binary.BigEndian.Uint16(b))<<32 | int64(binary.BigEndian.Uint32(b[2:]))
}

// decodeJob reads an encoded job.
func decodeJob(id string, v []byte) (*Job, error) {
	corrupt := func(why string) (*Job, error) {
		return nil, fmt.Errorf("delayqueue: job %q: corrupt encoding: %s", id, why)
	}
	if len(v) < jobHeaderLen {
		return corrupt("short header")
	}
	if v[0]&jobFormat == 0 {
		return nil, fmt.Errorf("delayqueue: job %q: unknown encoding: first byte %#x", id, v[0])
	}
	state := State(v[0] & 7)
	if state < StateDelayed || state > StateDead {
		return corrupt(fmt.Sprintf("state %d", state))
	}
	rest := v[jobHeaderLen:]
	errLen := 0
	if v[0]&jobHasError != 0 {
		if len(rest) < 2 {
			return corrupt("short error length")
		}
		errLen, rest = int(binary.BigEndian.Uint16(rest)), rest[2:]
	}
	var window time.Duration
	if v[0]&jobHasWindow != 0 {
		if len(rest) < 4 {
			return corrupt("short dedup window")
		}
		window, rest = time.Duration(binary.BigEndian.Uint32(rest))*time.Millisecond, rest[4:]
	}
	var nonce uint32
	if v[0]&jobHasNonce != 0 {
		if len(rest) < 4 {
			return corrupt("short push nonce")
		}
		nonce, rest = binary.BigEndian.Uint32(rest), rest[4:]
	}
	headersLen := 0
	if v[0]&jobHasHeaders != 0 {
		if len(rest) < 2 {
			return corrupt("short headers length")
		}
		headersLen, rest = int(binary.BigEndian.Uint16(rest)), rest[2:]
	}
	topicLen := int(v[21])
	if len(rest) < topicLen+errLen+headersLen {
		return corrupt("short topic, error or headers")
	}
	var headers map[string]string
	if headersLen > 0 {
		var err error
		if headers, err = decodeHeaders(rest[topicLen+errLen : topicLen+errLen+headersLen]); err != nil {
			return corrupt(err.Error())
		}
	}
	job := &Job{
		ID:          id,
		Topic:       string(rest[:topicLen]),
		LastError:   string(rest[topicLen : topicLen+errLen]),
		Headers:     headers,
		Body:        rest[topicLen+errLen+headersLen:],
		State:       state,
		Attempts:    int(binary.BigEndian.Uint16(v[1:])),
		MaxAttempts: int(binary.BigEndian.Uint16(v[3:])),
		TTR:         time.Duration(binary.BigEndian.Uint32(v[5:])) * time.Millisecond,
		DedupWindow: window,
		reservation: uint48(v[15:]),
		nonce:       nonce,
	}
	at := time.UnixMilli(uint48(v[9:]))
	switch job.State {
	case StateReserved:
		job.ReservedUntil = at
	case StateDead:
		job.DiedAt = at
		job.RunAt = at // a dead job's RunAt is when it died, as DiedAt
	default:
		job.RunAt = at
	}
	return job, nil
}
