package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The notifier's pub/sub connections: subscribing without waiting,
// reading, confirmations, and closing; wake_pubsub_repair.go subscribes
// again when Redis refuses a subscription or a Cluster slot moves. What a
// message means is wake_notify.go's business (dispatch).

// subscription is one pub/sub connection and its reader goroutine.
type subscription struct {
	key       int // in notifier.subs
	ps        *redis.PubSub
	done      chan struct{}            // closed when the reader returns; nil until it runs
	confirmed map[string]chan struct{} // closed at the channel's first confirmation
	dropped   bool                     // out of use: refused, or its slot went to another master
	refusals  int                      // refusals of its channels in a row, up to its making
	closing   sync.Once
	heard     atomic.Int64 // when its reader last read anything, Unix ns
	probing   atomic.Bool  // a probe's ping is on its way
}

// closePS closes the pub/sub connection once.
func (sub *subscription) closePS() error {
	var err error
	sub.closing.Do(func() { err = sub.ps.Close() })
	return err
}

// subscribe has the subscriptions to the channels, which carry what routes
// say, sent in the background, and returns at once. A subscription that
// cannot be sent now is sent again by go-redis when its reader reconnects.
// It returns the subscriptions of the channels, and ErrClosed after close.
func (n *notifier) subscribe(channels map[string]route) ([]*subscription, error) {
	return n.send(channels, 0)
}

// send is subscribe, for channels whose subscriptions Redis refused
// refusals times in a row.
func (n *notifier) send(channels map[string]route, refusals int) ([]*subscription, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	fresh := map[*subscription][]string{}
	var subs []*subscription
	for ch, r := range channels {
		n.routes[ch] = r
		key := r.key(n.env.sharded)
		sub := n.subs[key]
		if sub == nil {
			// No round trip: go-redis connects at the first (S)SUBSCRIBE,
			// to the node that owns that channel's slot.
			sub = &subscription{key: key, confirmed: map[string]chan struct{}{}, refusals: refusals}
			if n.env.sharded {
				sub.ps = n.env.client.SSubscribe(n.ctx)
			} else {
				sub.ps = n.env.client.Subscribe(n.ctx)
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
			if n.env.sharded {
				err = sub.ps.SSubscribe(n.ctx, chs...)
			} else {
				err = sub.ps.Subscribe(n.ctx, chs...)
			}
			if err != nil {
				// go-redis has recorded the channels; its reader
				// subscribes to them when it reconnects.
				n.env.logger.Debug("delayqueue: cannot subscribe yet; retrying in the background", attrError, err)
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
	go n.read(sub)
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

// read reads the subscription's connection until it is closed, or Redis
// refuses the subscription. It reads the replies itself, not through
// go-redis's channel, which drops an error reply without a word: Redis
// refuses an SSUBSCRIBE sent to a node that does not own the channel's slot
// (MOVED), and go-redis sends it to such a node whenever its slot map is out
// of date (a new client of a cluster whose nodes are still learning the
// slots, a slot that moved, a failover) and whenever it dials again after a
// broken connection (to a random node: it routes by the channels of
// SUBSCRIBE only). Such a subscription carries nothing, ever: a refusal has
// it replaced. As go-redis's channel does, it pings a connection idle for
// the health check interval, and go-redis dials again, and subscribes anew,
// when a connection breaks; a ping left unanswered as long as the client
// waits for any reply has the subscription replaced too.
func (n *notifier) read(sub *subscription) {
	defer close(sub.done)
	idle := max(n.env.poll, time.Second) // pub/sub health checks no rarer than the safety poll
	errs := 0                            // connection errors in a row
	pinged := false                      // a ping went, and nothing came back since
	for {
		wait := idle
		if pinged {
			wait = n.pongWait()
		}
		msg, err := sub.ps.ReceiveTimeout(n.ctx, wait)
		var reply redis.Error
		var netErr net.Error
		switch {
		case err == nil:
			errs, pinged = 0, false
			sub.heard.Store(time.Now().UnixNano())
		case errors.Is(err, redis.ErrClosed) || n.ctx.Err() != nil:
			return
		case errors.As(err, &reply):
			n.refused(sub, err)
			return
		case errors.As(err, &netErr) && netErr.Timeout():
			if pinged {
				// No answer to the ping: a link that broke without a
				// word (a peer gone, a partition), which TCP would take
				// minutes to notice. Start afresh.
				n.env.logger.Debug("delayqueue: no answer on a subscription; subscribing again", attrError, err)
				n.replace(sub, 0)
				return
			}
			// Idle: a ping whose write fails has go-redis dial again.
			pinged = true
			_ = sub.ps.Ping(n.ctx)
			continue
		default:
			// The connection broke. go-redis has dialed again already and
			// sent the subscriptions anew, or dials at the next receive.
			// What was on its way is lost: everyone behind the channels
			// looks at Redis now, not only once Redis confirms them
			// again. Then, not in a tight loop while the node is down.
			errs++
			if errs == 1 {
				n.resync(sub)
				continue
			}
			if !n.pause(retryBackoff(errs - 1)) {
				return
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				n.confirm(sub, m.Channel)
			case "sunsubscribe": // never asked for: the slot moved away
				n.replace(sub, 0)
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
	sub.refusals = 0
	n.mu.Unlock()
	n.dispatch(channel, "", true)
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
