package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier carries the queue's wake-ups over pub/sub: each bucket's wake
// channel ("<µs until due>" or "free") to the bucket's handler, and each
// bucket's ready channel of a topic ("<count>") to the Pops of that topic.
// On Redis Cluster the channels are sharded (SSUBSCRIBE), one connection per
// bucket to the master that owns it; elsewhere one connection carries all.
// Pub/sub loses what is published while a connection is down; when go-redis
// subscribes again after a reconnect, everyone listening there looks at
// Redis again. When a bucket's slot moves to another master, that master's
// Redis drops the sharded subscriptions; the notifier then subscribes anew
// on the bucket's new master.
type notifier struct {
	q       *DelayQueue
	sharded bool
	ctx     context.Context // ends at close; for re-subscribing in the background
	cancel  context.CancelFunc
	moves   sync.WaitGroup // re-subscriptions under way

	mu       sync.Mutex
	subs     map[int]*subscription // by bucket when sharded, else only 0
	routes   map[string]route      // channel -> what it carries
	topics   map[string]*topicWatch
	watched  map[string]bool // topics whose subscription was confirmed once
	handlers []*handler
	dropped  []*subscription // replaced after a slot move; their readers may still run
	closed   bool
}

// route is what a channel carries: the wake-ups of a bucket's handler, or
// the ready jobs of a topic in a bucket.
type route struct {
	bucket int
	topic  string // empty for the wake channel
}

// subscription is one pub/sub connection and its reader goroutine.
type subscription struct {
	key       int // in notifier.subs
	ps        *redis.PubSub
	done      chan struct{} // closed when the reader returns
	confirmed map[string]chan struct{}
	moved     bool // Redis dropped it: its slot went to another master
	closing   sync.Once
}

// closePS closes the pub/sub connection once.
func (sub *subscription) closePS() error {
	var err error
	sub.closing.Do(func() {
		if sub.ps != nil {
			err = sub.ps.Close()
		}
	})
	return err
}

// newNotifier makes the notifier; ctx carries values only, its end is
// ignored: the notifier lives until close.
func newNotifier(ctx context.Context, q *DelayQueue) *notifier {
	n := &notifier{
		q:       q,
		sharded: q.pub == "SPUBLISH",
		subs:    map[int]*subscription{},
		routes:  map[string]route{},
		topics:  map[string]*topicWatch{},
		watched: map[string]bool{},
	}
	n.ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return n
}

// subscribe subscribes to the channels, which carry what routes say, and
// waits until Redis confirms every one, so that nothing published
// afterwards is missed. ctx bounds the wait; the subscription itself goes
// on after it ends, as go-redis keeps it.
func (n *notifier) subscribe(ctx context.Context, channels map[string]route) error {
	var wait []chan struct{}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	fresh := map[int][]string{}
	for ch, r := range channels {
		n.routes[ch] = r
		key := 0
		if n.sharded {
			key = r.bucket
		}
		sub := n.subs[key]
		if sub == nil {
			sub = &subscription{key: key, confirmed: map[string]chan struct{}{}}
			n.subs[key] = sub
		}
		c, ok := sub.confirmed[ch]
		if !ok {
			c = make(chan struct{})
			sub.confirmed[ch] = c
			fresh[key] = append(fresh[key], ch)
		}
		wait = append(wait, c)
	}
	var errs []error
	for key, chs := range fresh {
		errs = append(errs, n.subscribeLocked(n.ctx, n.subs[key], chs))
	}
	n.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, c := range wait {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.q.done:
			return ErrClosed
		}
	}
	return nil
}

// subscribeLocked sends the subscription, opening the connection on first
// use: go-redis picks a Cluster connection's node by its first channel.
func (n *notifier) subscribeLocked(ctx context.Context, sub *subscription, channels []string) error {
	var err error
	switch {
	case sub.ps == nil && n.sharded:
		sub.ps = n.q.client.SSubscribe(ctx, channels...)
	case sub.ps == nil:
		sub.ps = n.q.client.Subscribe(ctx, channels...)
	case n.sharded:
		err = sub.ps.SSubscribe(ctx, channels...)
	default:
		err = sub.ps.Subscribe(ctx, channels...)
	}
	if sub.done == nil {
		sub.done = make(chan struct{})
		msgs := sub.ps.ChannelWithSubscriptions(
			redis.WithChannelSize(1024),
			redis.WithChannelHealthCheckInterval(max(n.q.opts.poll, time.Second)),
		)
		go n.read(sub, msgs)
	}
	if err != nil {
		for _, ch := range channels {
			delete(sub.confirmed, ch)
		}
		return fmt.Errorf("delayqueue: subscribe: %w", err)
	}
	return nil
}

// listenForHandlers subscribes to every bucket's wake channel.
func (n *notifier) listenForHandlers(ctx context.Context, hs []*handler) error {
	n.mu.Lock()
	n.handlers = hs
	n.mu.Unlock()
	channels := map[string]route{}
	for b := range n.q.opts.buckets {
		channels[n.q.keys.bucket(b).wake] = route{bucket: b}
	}
	return n.subscribe(ctx, channels)
}

// watch returns the topic's watch, subscribed to its ready channels. Only
// the first Pop of a topic waits for the subscription; later ones rely on
// it, and on the safety poll while it is being restored.
func (n *notifier) watch(ctx context.Context, topic string) (*topicWatch, error) {
	w := n.topicWatch(topic)
	n.mu.Lock()
	watched := n.watched[topic]
	n.mu.Unlock()
	if watched {
		return w, nil
	}
	channels := map[string]route{}
	for b := range n.q.opts.buckets {
		channels[n.q.keys.bucket(b).readyChannel(topic)] = route{bucket: b, topic: topic}
	}
	if err := n.subscribe(ctx, channels); err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.watched[topic] = true
	n.mu.Unlock()
	return w, nil
}

// topicWatch returns the topic's watch, made on first use, subscribed or not.
func (n *notifier) topicWatch(topic string) *topicWatch {
	n.mu.Lock()
	defer n.mu.Unlock()
	w, ok := n.topics[topic]
	if !ok {
		w = newTopicWatch(n.q.opts.buckets)
		n.topics[topic] = w
	}
	return w
}

func (n *notifier) read(sub *subscription, msgs <-chan any) {
	defer close(sub.done)
	for msg := range msgs {
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				n.confirm(sub, m.Channel)
			case "sunsubscribe": // never asked for: the slot moved away
				n.moved(sub)
			}
		case *redis.Message:
			n.dispatch(m.Channel, m.Payload, false)
		}
	}
}

// confirm marks channel subscribed. A second confirmation means go-redis
// reconnected and subscribed again: whatever was published in between is
// lost, so everyone listening on that channel looks at Redis again.
func (n *notifier) confirm(sub *subscription, channel string) {
	n.mu.Lock()
	confirmed, again := sub.confirmed[channel], false
	if confirmed != nil {
		select {
		case <-confirmed:
			again = true
		default:
			close(confirmed)
		}
	}
	n.mu.Unlock()
	if again {
		n.dispatch(channel, "", true)
	}
}

// moved replaces a subscription that Redis dropped because its bucket's slot
// went to another master: it subscribes again, on the new master, until
// that works or the notifier closes, and then has everyone behind it look at
// Redis again.
func (n *notifier) moved(sub *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || sub.moved {
		return
	}
	n.dropLocked(sub)
	channels := map[string]route{}
	for ch := range sub.confirmed {
		channels[ch] = n.routes[ch]
	}
	n.moves.Add(1)
	go func() {
		defer n.moves.Done()
		_ = sub.closePS()
		for attempt := 1; n.ctx.Err() == nil; attempt++ {
			n.q.noteError(n.ctx, errSlotMoved) // have go-redis learn the new owner
			ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
			err := n.subscribe(ctx, channels)
			cancel()
			if err == nil {
				for ch := range channels {
					n.dispatch(ch, "", true)
				}
				return
			}
			n.mu.Lock()
			retry := n.subs[sub.key]
			if retry != nil && !retry.moved {
				n.dropLocked(retry)
				for ch := range retry.confirmed { // a Pop may have added a topic meanwhile
					channels[ch] = n.routes[ch]
				}
			}
			n.mu.Unlock()
			if retry != nil {
				_ = retry.closePS()
			}
			wait := time.NewTimer(retryBackoff(attempt))
			select {
			case <-wait.C:
			case <-n.ctx.Done():
				wait.Stop()
			}
		}
	}()
}

// dropLocked takes a subscription out of use. Whoever still waits for one of
// its channels to be confirmed goes on: the safety poll, and the look that
// follows the new subscription, cover what it may miss.
func (n *notifier) dropLocked(sub *subscription) {
	sub.moved = true
	if n.subs[sub.key] == sub {
		delete(n.subs, sub.key)
	}
	n.dropped = append(n.dropped, sub)
	for _, c := range sub.confirmed {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

// errSlotMoved stands for Redis dropping a sharded subscription.
var errSlotMoved = errors.New("delayqueue: sharded subscription dropped: slot moved")

// dispatch delivers a wake-up; resync wakes everyone behind the channel.
func (n *notifier) dispatch(channel, payload string, resync bool) {
	n.mu.Lock()
	r, ok := n.routes[channel]
	var h *handler
	if r.bucket < len(n.handlers) {
		h = n.handlers[r.bucket]
	}
	w := n.topics[r.topic]
	n.mu.Unlock()
	switch {
	case !ok:
	case r.topic == "" && h == nil:
	case r.topic == "" && resync:
		h.wake(0)
		h.leaseFreed() // a "free" may have been lost too
	case r.topic == "" && payload == "free":
		h.leaseFreed()
	case r.topic == "":
		if us, err := strconv.ParseInt(payload, 10, 64); err == nil {
			h.wake(time.Duration(us) * time.Microsecond)
		}
	case w == nil:
	case resync:
		w.notify(r.bucket, math.MaxInt32)
	default:
		payload, from, _ := strings.Cut(payload, ":")
		if from != "" && h != nil && from == h.token {
			return // this process's handler moved the jobs, and woke its consumers
		}
		count, err := strconv.Atoi(payload)
		if err != nil {
			count = 1
		}
		w.notify(r.bucket, count)
	}
}

// notifyReady wakes this process's consumers for jobs that became ready in
// bucket b.
func (q *DelayQueue) notifyReady(b int, ready []topicCount) {
	if len(ready) == 0 {
		return
	}
	q.mu.Lock()
	n := q.notes
	q.mu.Unlock()
	if n == nil {
		return // nobody here pops
	}
	for _, r := range ready {
		n.mu.Lock()
		w := n.topics[r.topic]
		n.mu.Unlock()
		if w != nil {
			w.notify(b, r.count)
		}
	}
}

// close ends every subscription and waits for the reader goroutines.
func (n *notifier) close(ctx context.Context) error {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.moves.Wait()
	n.mu.Lock()
	subs := n.dropped
	for _, sub := range n.subs {
		subs = append(subs, sub)
	}
	n.mu.Unlock()
	var errs []error
	for _, sub := range subs {
		if err := sub.closePS(); err != nil {
			errs = append(errs, fmt.Errorf("delayqueue: close pub/sub: %w", err))
		}
	}
	for _, sub := range subs {
		if sub.done == nil {
			continue
		}
		select {
		case <-sub.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}
