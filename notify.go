package delayqueue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier is a queue's one pub/sub connection. It carries two kinds of
// wake-up: "<bucket>:<µs until due>" or "<bucket>:free" on the wake channel,
// for the bucket handlers, and "<bucket>:<count>" on a topic's ready
// channel, for the consumers of that topic. Pub/sub loses what is published while the
// connection is down; when go-redis re-subscribes after a reconnect, every
// handler and every consumer looks at Redis again.
type notifier struct {
	q      *DelayQueue
	pubsub *redis.PubSub
	done   chan struct{} // closed when the reader goroutine has returned

	mu         sync.Mutex
	subscribed map[string]chan struct{} // channel -> closed once confirmed
	topics     map[string]*topicWatch
	handlers   []*handler
}

func newNotifier(ctx context.Context, q *DelayQueue) (*notifier, error) {
	n := &notifier{
		q:          q,
		pubsub:     q.client.Subscribe(ctx),
		done:       make(chan struct{}),
		subscribed: make(map[string]chan struct{}),
		topics:     make(map[string]*topicWatch),
	}
	ch := n.pubsub.ChannelWithSubscriptions(
		redis.WithChannelSize(1024),
		redis.WithChannelHealthCheckInterval(max(q.opts.poll, time.Second)),
	)
	go n.run(ch)
	if err := n.subscribe(ctx, q.keys.wakeChannel()); err != nil {
		_ = n.close(ctx)
		return nil, err
	}
	return n, nil
}

// subscribe subscribes to channel and waits until Redis confirms it, so that
// nothing published afterwards is missed.
func (n *notifier) subscribe(ctx context.Context, channel string) error {
	n.mu.Lock()
	confirmed, ok := n.subscribed[channel]
	if !ok {
		confirmed = make(chan struct{})
		n.subscribed[channel] = confirmed
	}
	n.mu.Unlock()
	if !ok {
		if err := n.pubsub.Subscribe(ctx, channel); err != nil {
			n.mu.Lock()
			delete(n.subscribed, channel)
			n.mu.Unlock()
			return fmt.Errorf("delayqueue: subscribe %q: %w", channel, err)
		}
	}
	select {
	case <-confirmed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return ErrClosed
	}
}

// watch returns the topic's watch, subscribed to its ready channel.
func (n *notifier) watch(ctx context.Context, topic string) (*topicWatch, error) {
	n.mu.Lock()
	w, ok := n.topics[topic]
	if !ok {
		w = newTopicWatch(n.q.opts.buckets)
		n.topics[topic] = w
	}
	n.mu.Unlock()
	if err := n.subscribe(ctx, n.q.keys.readyChannel(topic)); err != nil {
		return nil, err
	}
	return w, nil
}

func (n *notifier) setHandlers(hs []*handler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.handlers = hs
}

func (n *notifier) run(ch <-chan any) {
	defer close(n.done)
	for msg := range ch {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				n.confirm(m.Channel)
			}
		case *redis.Message:
			n.dispatch(m.Channel, m.Payload)
		}
	}
}

// confirm marks channel subscribed. A second confirmation means go-redis
// reconnected and subscribed again: whatever was published in between is
// lost, so everyone listening on that channel looks at Redis again.
func (n *notifier) confirm(channel string) {
	n.mu.Lock()
	confirmed := n.subscribed[channel]
	n.mu.Unlock()
	if confirmed == nil {
		return
	}
	select {
	case <-confirmed:
	default:
		close(confirmed)
		return
	}
	if channel == n.q.keys.wakeChannel() {
		for _, h := range n.handlerList() {
			h.wake(0)
		}
		return
	}
	if w := n.topic(channel); w != nil {
		w.recheckAll()
	}
}

func (n *notifier) dispatch(channel, payload string) {
	if channel == n.q.keys.wakeChannel() {
		b, rest, _ := strings.Cut(payload, ":")
		h := n.handler(b)
		if h == nil {
			return
		}
		if rest == "free" {
			h.leaseFreed()
			return
		}
		if us, err := strconv.ParseInt(rest, 10, 64); err == nil {
			h.wake(time.Duration(us) * time.Microsecond)
		}
		return
	}
	if w := n.topic(channel); w != nil {
		b, count, _ := strings.Cut(payload, ":")
		bi, err := strconv.Atoi(b)
		if err != nil {
			return
		}
		c, err := strconv.Atoi(count)
		if err != nil {
			c = 1
		}
		w.notify(bi, c)
	}
}

func (n *notifier) topic(channel string) *topicWatch {
	topic, ok := strings.CutPrefix(channel, n.q.keys.readyChannelPrefix())
	if !ok {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.topics[topic]
}

func (n *notifier) handler(bucket string) *handler {
	b, err := strconv.Atoi(bucket)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil || b < 0 || b >= len(n.handlers) {
		return nil
	}
	return n.handlers[b]
}

func (n *notifier) handlerList() []*handler {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.handlers
}

// close ends the subscription and waits for the reader goroutine.
func (n *notifier) close(ctx context.Context) error {
	if err := n.pubsub.Close(); err != nil {
		return fmt.Errorf("delayqueue: close pub/sub: %w", err)
	}
	select {
	case <-n.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
