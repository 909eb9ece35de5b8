package delayqueue

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
)

// A listCursor is where a listing goes on (in one of its two forms).
type listCursor struct {
	queue, topic string
	state        State
	buckets      int
	at           *scorePos // delayed, reserved, dead: nil at the start
	lists        []int64   // ready: per bucket, the place of the last entry taken; -1 at the start
}

// scorePos is a position in the order of a zset: score, then member.
type scorePos struct {
	score  int64
	member string
}

func (a scorePos) compare(b scorePos) int {
	if c := cmp.Compare(a.score, b.score); c != 0 {
		return c
	}
	return strings.Compare(a.member, b.member) // as Redis orders a score's members
}

// A cursor (JobPage.Next) is, in base64 (URL alphabet, no padding): a
// version byte, the state, the bucket count (uvarint), the position, and a
// CRC-32 of all that with the queue's name and the topic, which lets List
// refuse a cursor of another listing, or one cut short. The position is,
// for a zset, the score (varint) and member; for ready lists, per bucket
// the place (uvarint, plus one; 0 for the head).
const cursorVersion = 2

func (c listCursor) encode() string {
	b := []byte{cursorVersion, byte(c.state)}
	b = binary.AppendUvarint(b, uint64(c.buckets))
	if c.state != StateReady {
		if c.at != nil {
			b = binary.AppendVarint(b, c.at.score)
			b = append(b, c.at.member...)
		}
	} else {
		for _, p := range c.lists {
			b = binary.AppendUvarint(b, uint64(p+1))
		}
	}
	b = binary.BigEndian.AppendUint32(b, c.sum(b))
	return base64.RawURLEncoding.EncodeToString(b)
}

// sum is the checksum of a cursor's bytes b, for c's queue and topic.
func (c listCursor) sum(b []byte) uint32 {
	h := crc32.NewIEEE()
	_, _ = h.Write(b)
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(c.queue))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(c.topic))
	return h.Sum32()
}

// decodeCursor reads a cursor of a listing of topic's jobs in state in the
// queue named queue, of buckets buckets; "" is the start.
func decodeCursor(s, queue, topic string, state State, buckets int) (listCursor, error) {
	c := listCursor{queue: queue, topic: topic, state: state, buckets: buckets}
	if state == StateReady {
		c.lists = make([]int64, buckets)
		for i := range c.lists {
			c.lists[i] = -1
		}
	}
	if s == "" {
		return c, nil
	}
	bad := fmt.Errorf("%w: %.40q is not a cursor of %s jobs of %q", ErrInvalidCursor, s, state, topic)
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) < 7 || binary.BigEndian.Uint32(b[len(b)-4:]) != c.sum(b[:len(b)-4]) {
		return c, bad
	}
	b = b[:len(b)-4]
	if b[0] != cursorVersion || State(b[1]) != state {
		return c, bad
	}
	b = b[2:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n != uint64(buckets) {
		return c, bad
	}
	b = b[k:]
	if state != StateReady {
		if len(b) == 0 {
			return c, nil
		}
		score, k := binary.Varint(b)
		if k <= 0 || validateID(string(b[k:])) != nil {
			return c, bad
		}
		c.at = &scorePos{score, string(b[k:])}
		return c, nil
	}
	for i := range c.lists {
		place, k := binary.Uvarint(b)
		if k <= 0 || place > 1<<62 {
			return c, bad
		}
		c.lists[i] = int64(place) - 1
		b = b[k:]
	}
	if len(b) != 0 {
		return c, bad
	}
	return c, nil
}
