package dqprom_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/redis/go-redis/v9"
)

func Example() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()

	m := dqprom.New(dqprom.Options{Queue: "orders"})
	q, err := delayqueue.New(client, delayqueue.WithName("orders"), delayqueue.WithObserver(m))
	if err != nil {
		panic(err)
	}
	defer q.Close(ctx)
	reg := prometheus.NewRegistry() // yours; in a service, served by promhttp.HandlerFor(reg, ...)
	reg.MustRegister(m, m.Gauges(q))

	for range 2 {
		if _, err := q.Push(ctx, &delayqueue.Job{Topic: "order.cancel"}); err != nil {
			panic(err)
		}
	}
	job, err := q.Pop(ctx, "order.cancel", 0)
	if err != nil {
		panic(err)
	}
	if err := q.Finish(ctx, job.ID); err != nil {
		panic(err)
	}

	// What a scrape returns: here the counters that are not zero.
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	var b strings.Builder
	for _, f := range families {
		_, _ = expfmt.MetricFamilyToText(&b, f)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "delayqueue_jobs_") && !strings.HasSuffix(line, " 0") {
			fmt.Println(line)
		}
	}
	// Output:
	// delayqueue_jobs_delivered_total{queue="orders",topic="order.cancel"} 1
	// delayqueue_jobs_finished_total{queue="orders",topic="order.cancel"} 1
	// delayqueue_jobs_pushed_total{existed="false",queue="orders",topic="order.cancel"} 2
}
