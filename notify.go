package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier carries the queue's wake-ups over pub/sub: each bucket's wake
// channel ("<µs until due>" or "free") to the bucket's handler, and each
// bucket's ready channel of a topic ("<count>" or "<count>:<move mark>") to
// the Pops of that topic. On Redis Cluster the channels are sharded
// (SSUBSCRIBE), one connection per bucket to the master that owns it;
// elsewhere one connection carries all.
//
// Nobody waits for a subscription: a handler moves and a Pop looks at Redis
// at once, and every confirmation of a subscription, the first one and
// those that follow a reconnect (pub/sub loses what is published while it is
// not subscribed), makes everyone behind the channel look at Redis again.
// When a bucket's slot moves to another master, that master's Redis drops
// the sharded subscriptions; the notifier then subscribes anew on the
// bucket's new master. No lock of the notifier is held while it talks to
// Redis.
type notifier struct {
	q       *DelayQueue
	sharded bool
	ctx     context.Context // ends at close; for re-subscribing in the background
	cancel  context.CancelFunc
	moves   sync.WaitGroup // re-subscriptions under way
	sends   sync.WaitGroup // subscriptions being sent

	mu       sync.Mutex
	subs     map[int]*subscription // by bucket when sharded, else only 0
	routes   map[string]route      // channel -> what it carries
	topics   map[string]*topicWatch
	watched  map[string]bool // topics whose subscription was sent
	handlers []*bucketHandler
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
	done      chan struct{}            // closed when the reader returns; nil until it runs
	confirmed map[string]chan struct{} // closed at the channel's first confirmation
	moved     bool                     // Redis dropped it: its slot went to another master
	closing   sync.Once
}

// closePS closes the pub/sub connection once.
func (sub *subscription) closePS() error {
	var err error
	sub.closing.Do(func() { err = sub.ps.Close() })
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

// subscribe has the subscriptions to the channels, which carry what routes
// say, sent in the background, and returns at once. A subscription that
// cannot be sent now is sent again by go-redis when its reader reconnects.
// It returns the subscriptions of the channels, and ErrClosed after close.
func (n *notifier) subscribe(channels map[string]route) ([]*subscription, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	fresh := map[*subscription][]string{}
	var subs []*subscription
	for ch, r := range channels {
		n.routes[ch] = r
		key := 0
		if n.sharded {
			key = r.bucket
		}
		sub := n.subs[key]
		if sub == nil {
			// No round trip: go-redis connects at the first (S)SUBSCRIBE,
			// to the node that owns that channel's slot.
			sub = &subscription{key: key, confirmed: map[string]chan struct{}{}}
			if n.sharded {
				sub.ps = n.q.client.SSubscribe(n.ctx)
			} else {
				sub.ps = n.q.client.Subscribe(n.ctx)
			}
			n.subs[key] = sub
		}
		if _, ok := sub.confirmed[ch]; !ok {
			sub.confirmed[ch] = make(chan struct{})
			fresh[sub] = append(fresh[sub], ch)
		}
		if !slices.Contains(subs, sub) {
			subs = append(subs, sub)
		}
	}
	// Sent in the background: dialing and writing can take as long as the
	// network makes them, and nobody waits for them.
	n.sends.Add(len(fresh))
	n.mu.Unlock()
	for sub, chs := range fresh {
		go func() {
			defer n.sends.Done()
			var err error
			if n.sharded {
				err = sub.ps.SSubscribe(n.ctx, chs...)
			} else {
				err = sub.ps.Subscribe(n.ctx, chs...)
			}
			if err != nil {
				// go-redis has recorded the channels; its reader
				// subscribes to them when it reconnects.
				n.q.opts.logger.Debug("delayqueue: cannot subscribe yet; retrying in the background", attrError, err)
			}
			n.startReader(sub)
		}()
	}
	return subs, nil
}

// startReader starts the subscription's reader goroutine, once. It runs
// after the first (S)SUBSCRIBE, so that a Cluster connection goes to the
// node of the channels, not to a random one.
func (n *notifier) startReader(sub *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if sub.done != nil || n.closed {
		return
	}
	sub.done = make(chan struct{})
	msgs := sub.ps.ChannelWithSubscriptions(
		redis.WithChannelSize(1024),
		redis.WithChannelHealthCheckInterval(max(n.q.opts.poll, time.Second)),
	)
	go n.read(sub, msgs)
}

// confirmedAll waits until Redis has confirmed every channel of the
// subscriptions, ctx ends, or a subscription is dropped.
func (n *notifier) confirmedAll(ctx context.Context, subs []*subscription) error {
	var wait []chan struct{}
	n.mu.Lock()
	for _, sub := range subs {
		for _, c := range sub.confirmed {
			wait = append(wait, c)
		}
	}
	n.mu.Unlock()
	for _, c := range wait {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// listenForHandlers subscribes to every bucket's wake channel.
func (n *notifier) listenForHandlers(hs []*bucketHandler) error {
	n.mu.Lock()
	n.handlers = hs
	n.mu.Unlock()
	channels := map[string]route{}
	for b := range n.q.opts.buckets {
		channels[n.q.keys.bucket(b).wake] = route{bucket: b}
	}
	_, err := n.subscribe(channels)
	return err
}

// watch returns the topic's watch, and sends the subscription to its ready
// channels on the first call for the topic.
func (n *notifier) watch(topic string) (*topicWatch, error) {
	w := n.topicWatch(topic)
	n.mu.Lock()
	sent := n.watched[topic]
	n.watched[topic] = true
	n.mu.Unlock()
	if sent {
		return w, nil
	}
	channels := map[string]route{}
	for b := range n.q.opts.buckets {
		channels[n.q.keys.bucket(b).readyChannel(topic)] = route{bucket: b, topic: topic}
	}
	if _, err := n.subscribe(channels); err != nil {
		return nil, err
	}
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

// confirm marks channel subscribed, and has everyone listening on it look at
// Redis again: whatever was published before, while it was not subscribed
// (at first, or between a reconnect and go-redis subscribing again), is
// lost.
func (n *notifier) confirm(sub *subscription, channel string) {
	n.mu.Lock()
	if c := sub.confirmed[channel]; c != nil {
		select {
		case <-c:
		default:
			close(c)
		}
	}
	n.mu.Unlock()
	n.dispatch(channel, "", true)
}

// moved replaces a subscription that Redis dropped because its bucket's slot
// went to another master: it subscribes again, on the new master, until
// Redis confirms it there (which makes everyone behind it look again) or the
// notifier closes.
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
			subs, err := n.subscribe(channels)
			if err != nil {
				return // closed
			}
			ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
			err = n.confirmedAll(ctx, subs)
			cancel()
			if err == nil {
				return
			}
			// Not confirmed in time: still on the old master, say. Drop
			// it and subscribe afresh.
			n.mu.Lock()
			for _, retry := range subs {
				if !retry.moved {
					n.dropLocked(retry)
					for ch := range retry.confirmed { // a Pop may have added a topic meanwhile
						channels[ch] = n.routes[ch]
					}
				}
			}
			n.mu.Unlock()
			for _, retry := range subs {
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
	var h *bucketHandler
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
		payload, mark, _ := strings.Cut(payload, ":")
		if token, _, _ := strings.Cut(mark, ":"); h != nil && token == h.token && !h.claimWake(mark, r.topic) {
			return // this process's handler woke its consumers from the move's reply
		}
		count, err := strconv.Atoi(payload)
		if err != nil {
			count = 1
		}
		w.notify(r.bucket, count)
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
	subs := slices.Clone(n.dropped)
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
	n.sends.Wait() // a closed connection ends a send
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
