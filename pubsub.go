package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The notifier's pub/sub connections: subscribing without waiting,
// reading, confirmations, re-subscribing when a Cluster slot moves, and
// closing. What a message means is notify.go's business (dispatch).

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
		if n.env.sharded {
			key = r.bucket
		}
		sub := n.subs[key]
		if sub == nil {
			// No round trip: go-redis connects at the first (S)SUBSCRIBE,
			// to the node that owns that channel's slot.
			sub = &subscription{key: key, confirmed: map[string]chan struct{}{}}
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
	msgs := sub.ps.ChannelWithSubscriptions(
		redis.WithChannelSize(1024),
		redis.WithChannelHealthCheckInterval(max(n.env.poll, time.Second)),
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
			n.env.slotMoved(n.ctx) // have go-redis learn the new owner
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
