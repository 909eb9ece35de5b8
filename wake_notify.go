package delayqueue

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier carries the queue's messages over pub/sub: each bucket's wake
// channel ("<µs until due>" or "free") to the bucket handler that holds or
// stands by for its lease, and the queue's control channel to every
// started or consuming process ("resume:<topic>", "limits:<topic>",
// "standby:<bucket>", "sooner:<bucket>"). Ready jobs do not travel here: their signals are
// lists that consumers block on (wake_signals.go). On Redis Cluster the channels
// are sharded (SSUBSCRIBE), one connection per bucket (and one for the
// control channel) to the master that owns it; elsewhere one connection
// carries all.
//
// Nobody waits for a subscription: a bucket handler looks at Redis at once,
// and every confirmation of a subscription, the first one and those that
// follow a reconnect (pub/sub loses what is published while it is not
// subscribed), makes everyone behind the channel look at Redis again. When a
// bucket's slot moves to another master, that master's Redis drops the sharded
// subscriptions; the notifier then subscribes anew on the bucket's new master.
// So it does when Redis refuses a subscription: a sharded one sent to a node
// that does not own the bucket's slot, as go-redis does whenever its slot
// map is out of date. No lock of the notifier is held while it talks to
// Redis.
type notifier struct {
	env    notifierEnv
	ctx    context.Context // ends at close; for re-subscribing in the background
	cancel context.CancelFunc
	moves  sync.WaitGroup // re-subscriptions under way (see replace)
	sends  sync.WaitGroup // subscriptions being sent

	mu         sync.Mutex
	subs       map[int]*subscription // by bucket when sharded (controlKey for the control channel), else only 0
	routes     map[string]route      // channel -> what it carries
	handlers   map[int]bucketWaker   // by bucket: the handlers listening
	dropped    []*subscription       // replaced (refused, or their slot moved); their readers may still run
	controlled bool                  // the control channel's subscription was sent
	closed     bool
}

// controlKey is the control channel's subscription in notifier.subs on a
// Cluster.
const controlKey = -1

// notifierEnv is all the notifier takes from the queue: the client, the
// channel names and the settings it reads, and where control messages go.
type notifierEnv struct {
	client      redis.UniversalClient
	sharded     bool          // SSUBSCRIBE, one connection per bucket (Redis Cluster)
	poll        time.Duration // the safety poll: pub/sub health checks no rarer
	readTimeout time.Duration // the client's wait for a reply; 0 or less: none
	logger      *slog.Logger
	wakeChannel func(b int) string
	control     string
	// slotMoved has the client learn a slot's new owner.
	slotMoved func(ctx context.Context)
	// controlled handles a message of the control channel; "" when it was
	// resynced (its subscription confirmed): what it carried may be lost.
	controlled func(msg string)
}

// A bucketWaker is what the notifier wakes on a bucket's wake channel:
// this process's bucket handler.
type bucketWaker interface {
	// wake asks for a look after delay: a job became due then.
	wake(delay time.Duration)
	// leaseFreed says the bucket's lease was released.
	leaseFreed()
}

// route is what a channel carries: the wake-ups of a bucket's handler, or
// control messages.
type route struct {
	bucket  int
	control bool
}

// key is the route's subscription in notifier.subs.
func (r route) key(sharded bool) int {
	switch {
	case !sharded:
		return 0
	case r.control:
		return controlKey
	}
	return r.bucket
}

// newNotifier makes the notifier; ctx carries values only, its end is
// ignored: the notifier lives until close.
func newNotifier(ctx context.Context, env notifierEnv) *notifier {
	n := &notifier{
		env:      env,
		subs:     map[int]*subscription{},
		routes:   map[string]route{},
		handlers: map[int]bucketWaker{},
	}
	n.ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return n
}

// listenForBucket subscribes to bucket b's wake channel, for its handler h.
func (n *notifier) listenForBucket(b int, h bucketWaker) error {
	n.mu.Lock()
	n.handlers[b] = h
	n.mu.Unlock()
	_, err := n.subscribe(map[string]route{n.env.wakeChannel(b): {bucket: b}})
	return err
}

// listenForControl subscribes to the control channel, once.
func (n *notifier) listenForControl() error {
	n.mu.Lock()
	done := n.controlled
	n.controlled = true
	n.mu.Unlock()
	if done {
		return nil
	}
	_, err := n.subscribe(map[string]route{n.env.control: {control: true}})
	return err
}

// dispatch delivers a message; resync wakes everyone behind the channel.
func (n *notifier) dispatch(channel, payload string, resync bool) {
	n.mu.Lock()
	r, ok := n.routes[channel]
	h := n.handlers[r.bucket]
	n.mu.Unlock()
	switch {
	case !ok:
	case r.control && resync:
		n.env.controlled("")
	case r.control:
		n.env.controlled(payload)
	case h == nil:
	case resync:
		h.wake(0)
		h.leaseFreed() // a "free" may have been lost too
	case payload == "free":
		h.leaseFreed()
	default:
		if us, err := strconv.ParseInt(payload, 10, 64); err == nil {
			h.wake(time.Duration(us) * time.Microsecond)
		}
	}
}

// Control messages.
const (
	controlResume  = "resume:"  // and a topic: it was resumed
	controlStandby = "standby:" // and a bucket: a standby lease of it is free
	controlSooner  = "sooner:"  // and a bucket: its second standby is to look now
	controlLimits  = "limits:"  // and a topic: its limits changed
)

// control handles a message of the control channel ("" after a resync).
func (q *DelayQueue) control(msg string) {
	q.mu.Lock()
	w, handlers := q.waits, q.handlers
	q.mu.Unlock()
	if msg == "" {
		// Whatever was said while not subscribed: a paused topic looks
		// again (its resume may be lost), a handler without a role tries
		// for a standby lease.
		if w != nil {
			w.resumePaused()
		}
		for _, h := range handlers {
			h.standbyVacant()
		}
		q.limitsChanged("")
		return
	}
	if topic, ok := strings.CutPrefix(msg, controlLimits); ok {
		q.limitsChanged(topic)
	}
	if topic, ok := strings.CutPrefix(msg, controlResume); ok && w != nil {
		w.resume(topic)
	}
	if h := handlerOf(msg, controlStandby, handlers); h != nil {
		h.standbyVacant()
	}
	if h := handlerOf(msg, controlSooner, handlers); h != nil {
		h.lookSooner()
	}
}

// handlerOf is the handler of the bucket that a control message with
// prefix names; nil when msg has another prefix or names no bucket.
func handlerOf(msg, prefix string, handlers []*bucketHandler) *bucketHandler {
	s, ok := strings.CutPrefix(msg, prefix)
	if !ok {
		return nil
	}
	if b, err := strconv.Atoi(s); err == nil && b >= 0 && b < len(handlers) {
		return handlers[b]
	}
	return nil
}

// announce tells every process of the queue msg, on the control channel.
// A message lost on the way is made up for by their looks after a
// resubscription and by their safety polls: it is logged at debug level.
func (q *DelayQueue) announce(ctx context.Context, msg string) {
	var err error
	if q.pub == "SPUBLISH" {
		err = q.client.SPublish(ctx, q.keys.control(), msg).Err()
	} else {
		err = q.client.Publish(ctx, q.keys.control(), msg).Err()
	}
	if err != nil {
		q.opts.logger.Debug("delayqueue: cannot announce on the control channel", "message", msg, attrError, err)
	}
}

// notifierLocked returns the queue's pub/sub listener, making it on first
// use, subscribed to the control channel. q.mu must be held.
func (q *DelayQueue) notifierLocked(ctx context.Context) *notifier {
	if q.notes == nil {
		q.notes = newNotifier(ctx, notifierEnv{
			client:      q.client,
			sharded:     q.pub == "SPUBLISH",
			poll:        q.opts.poll,
			readTimeout: q.readTimeout,
			logger:      q.opts.logger,
			wakeChannel: func(b int) string { return q.keys.bucket(b).wake },
			control:     q.keys.control(),
			slotMoved:   func(ctx context.Context) { q.noteError(ctx, errSlotMoved) },
			controlled:  q.control,
		})
		_ = q.notes.listenForControl() // fails only when closed
	}
	return q.notes
}

// listenForBucket has the notifier carry bucket b's wake channel to its
// handler.
func (q *DelayQueue) listenForBucket(b int) {
	q.mu.Lock()
	n, h := q.notes, q.handlers
	q.mu.Unlock()
	if n != nil && b < len(h) {
		if err := n.listenForBucket(b, h[b]); err != nil && !errors.Is(err, ErrClosed) {
			q.opts.logger.Warn("delayqueue: cannot listen for the bucket's wake-ups", attrBucket, b, attrError, err)
		}
	}
}

// errSlotMoved stands for Redis dropping a sharded subscription.
var errSlotMoved = errors.New("delayqueue: sharded subscription dropped: slot moved")
