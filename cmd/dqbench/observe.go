package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dqprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// What -observe attaches to the queues under test, to measure its cost.
const (
	observeNone = "none"
	observeProm = "prom" // dqprom, scraped every second
)

// scrapeEvery is how often an observed queue's registry is scraped, as a
// Prometheus server set to scrape every second would.
const scrapeEvery = time.Second

// openObserved opens a queue through open with what kind names attached
// (observeNone or "": nothing), and returns a function that detaches it once
// the queue is done with. With observeProm, the queue's Observer is a
// dqprom.Metrics, and a goroutine scrapes a registry of the metrics and the
// queue's gauges every second, encoding it as promhttp would, until
// detached.
func openObserved(kind string, open func(...delayqueue.Option) (*delayqueue.DelayQueue, error)) (*delayqueue.DelayQueue, func(), error) {
	if kind != observeProm {
		q, err := open()
		return q, func() {}, err
	}
	m := dqprom.New(dqprom.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	q, err := open(delayqueue.WithObserver(m))
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, m.Gauges(q))
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(scrapeEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if err := scrape(reg, io.Discard); err != nil {
					fmt.Fprintln(os.Stderr, "dqbench: scrape:", err)
				}
			}
		}
	}()
	return q, func() {
		close(stop)
		<-stopped
	}, nil
}

// scrape gathers reg and writes it in the text format, as a scrape does.
func scrape(reg prometheus.Gatherer, w io.Writer) error {
	families, err := reg.Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			return err
		}
	}
	return nil
}
