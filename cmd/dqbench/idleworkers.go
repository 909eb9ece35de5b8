package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Scenario iw: what idle worker processes cost Redis. -consumers started
// processes, each with a Consume waiting on one topic and no job, as a
// service's workers wait at night; the commands they send and run over a
// window, per process. On a Cluster each bucket (8 by default; 1
// elsewhere) has its own lease and blocked call, and costs as much.
//
//	go run ./cmd/dqbench -only iw -consumers 10 -runs 2
//	go run ./cmd/dqbench -only iw -consumers 10 -cluster

const (
	idleSettle = 25 * time.Second // start-up: leases taken, standbys found, a first history sample
	idleWindow = 60 * time.Second // three blocked-call waits, six lease renewals
)

func init() {
	namedScenarios = append(namedScenarios, scenario{"iw", "idle workers: commands per idle started process", idleWorkers})
}

func idleWorkers(ctx context.Context, b *bench) (figures, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	f := newFleet(newReceipts(1))
	defer f.kill()
	args := []string{
		"-addrs", strings.Join(b.addrs, ","), "-queue", b.queueName("iw"),
		"-impl", "dq", "-method", "consume", "-start", "-jobs", "1", "-due", string(dueHour),
		"-timeout", (idleSettle + idleWindow + time.Minute).String(),
		"-cluster=" + strconv.FormatBool(b.cluster), "-observe", b.observe,
	}
	for i := range b.consumers {
		if _, err := f.start(fmt.Sprintf("worker %d", i+1), "consumer", args...); err != nil {
			return nil, err
		}
	}
	if err := f.waitReady(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	if err := pause(ctx, idleSettle); err != nil {
		return nil, err
	}
	before, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	if err := pause(ctx, idleWindow); err != nil {
		return nil, err
	}
	after, err := b.commandCalls(ctx)
	if err != nil {
		return nil, err
	}
	if err := f.stop(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	d := after.sub(before)
	per := idleWindow.Seconds() * float64(b.consumers)
	return figures{
		{"commands sent per second per process", "cmd/s", float64(d.sent) / per},
		{"commands run per second per process, incl. inside scripts", "cmd/s", float64(d.run) / per},
	}, nil
}

// pause waits for d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
