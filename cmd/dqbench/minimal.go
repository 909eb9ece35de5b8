package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// The minimal design is the baseline the layout scenarios hold the queue
// against: what a delay queue on Redis can least be. A push is one ZADD of
// the job (a unique ID and its body) scored by its due time; one mover per
// queue moves due jobs to a list with one script call per 100; consumers
// BLPOP that list. No reservation, no acknowledgement, no retry, no
// buckets: a job a consumer takes is gone, and the whole queue is one key
// pair, so on a Cluster it lives on one master.

//go:embed minmove.lua
var minMoveSource string

var minMove = redis.NewScript(minMoveSource)

const (
	minBatch    = 100                   // most jobs one mover call moves
	minMaxSleep = 10 * time.Millisecond // longest the mover sleeps between calls
	minIDLen    = 16                    // hex characters of a job's ID before its body
)

// minKeys names the baseline's two keys for queue q, in one hash slot.
func minKeys(q string) (zset, list string) {
	return "min:{" + q + "}:z", "min:{" + q + "}:l"
}

// minimal is one process's handle on the baseline.
type minimal struct {
	client     redis.UniversalClient
	zset, list string
	mover      bool // whether this process runs the mover while it consumes

	idPrefix uint32 // random per process, so IDs of several producers differ
	idSeq    atomic.Uint32
}

func openMinimal(client redis.UniversalClient, queue string, mover bool) *minimal {
	m := &minimal{client: client, mover: mover, idPrefix: rand.Uint32()}
	m.zset, m.list = minKeys(queue)
	return m
}

// push adds one job with one ZADD. how does not matter: the baseline knows
// due times only.
func (m *minimal) push(ctx context.Context, body []byte, due int64, _ dueKind) error {
	member := make([]byte, 0, minIDLen+len(body))
	member = appendHex32(appendHex32(member, m.idPrefix), m.idSeq.Add(1))
	member = append(member, body...)
	return m.client.ZAdd(ctx, m.zset, redis.Z{Score: float64(due), Member: member}).Err()
}

// appendHex32 appends v as 8 hex digits.
func appendHex32(b []byte, v uint32) []byte {
	const digits = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>shift&0xf])
	}
	return b
}

// consume pops with 16 workers, each a BLPOP with a timeout of a second,
// and runs the mover too when this process is the one that moves. It
// returns when ctx ends (a BLPOP under way finishes first, and what it
// returns is delivered) or at the first error.
func (m *minimal) consume(ctx context.Context, got func(delivery)) error {
	g, ctx := errgroup.WithContext(ctx)
	if m.mover {
		g.Go(func() error { return m.move(ctx) })
	}
	for range workers {
		g.Go(func() error {
			for ctx.Err() == nil {
				kv, err := m.client.BLPop(ctx, time.Second, m.list).Result()
				switch {
				case err == nil:
					member := kv[1]
					if len(member) < minIDLen {
						return fmt.Errorf("min: member %q without an ID", member)
					}
					got(delivery{body: []byte(member[minIDLen:])})
				case errors.Is(err, redis.Nil):
				case ctx.Err() != nil:
					return nil
				default:
					return fmt.Errorf("min: blpop: %w", err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// move calls the mover script at once again when it moved a full batch,
// else sleeps until the next job is due, at most 10 ms.
func (m *minimal) move(ctx context.Context) error {
	keys := []string{m.zset, m.list}
	batch := strconv.Itoa(minBatch)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		r, err := minMove.Run(ctx, m.client, keys, batch).Int64Slice()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("min: move: %w", err)
		case len(r) != 2:
			return fmt.Errorf("min: move returned %v", r)
		}
		wait := minMaxSleep
		switch moved, next := r[0], time.Duration(r[1])*time.Millisecond; {
		case moved == minBatch:
			wait = 0
		case next >= 0 && next < wait:
			wait = next
		}
		timer.Reset(wait)
	}
}

func (m *minimal) close(context.Context) error { return nil }
