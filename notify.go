package delayqueue

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier carries the queue's wake-ups over pub/sub: each bucket's wake
// channel ("<µs until due>" or "free") to the bucket handler, and each
// bucket's ready channel of a topic ("<count>" or "<count>:<move mark>") to
// the Pops of that topic. On Redis Cluster the channels are sharded
// (SSUBSCRIBE), one connection per bucket to the master that owns it;
// elsewhere one connection carries all.
//
// Nobody waits for a subscription: a bucket handler moves and a Pop looks at
// Redis at once, and every confirmation of a subscription, the first one and
// those that follow a reconnect (pub/sub loses what is published while it is not
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

	mu       sync.Mutex
	subs     map[int]*subscription // by bucket when sharded, else only 0
	routes   map[string]route      // channel -> what it carries
	topics   map[string]*topicWatch
	watched  map[string]bool // topics whose subscription was sent
	handlers []bucketWaker   // by bucket; nil where this process does not move
	dropped  []*subscription // replaced (refused, or their slot moved); their readers may still run
	closed   bool
}

// notifierEnv is all the notifier takes from the queue: the client, the
// channel names and the settings it reads.
type notifierEnv struct {
	client       redis.UniversalClient
	sharded      bool // SSUBSCRIBE, one connection per bucket (Redis Cluster)
	buckets      int
	poll         time.Duration // the safety poll: pub/sub health checks no rarer
	readTimeout  time.Duration // the client's wait for a reply; 0 or less: none
	logger       *slog.Logger
	wakeChannel  func(b int) string
	readyChannel func(b int, topic string) string
	// slotMoved has the client learn a slot's new owner.
	slotMoved func(ctx context.Context)
	// resynced says a ready channel was resynced (its subscription
	// confirmed, or its topic resumed): what it carried may have been
	// lost, a resume included, so the paused topics are read again.
	resynced func()
}

// A bucketWaker is what the notifier wakes on a bucket's wake channel:
// this process's bucket handler.
type bucketWaker interface {
	// wake asks for a look after delay: a job became due then.
	wake(delay time.Duration)
	// leaseFreed says the bucket's lease was released.
	leaseFreed()
	// wokeFromReply reports whether a ready notification of topic, marked by the
	// move that sent it, comes from this bucket handler's own move, whose reply
	// woke this process's consumers already.
	wokeFromReply(mark, topic string) bool
}

// route is what a channel carries: the wake-ups of a bucket handler, or
// the ready jobs of a topic in a bucket.
type route struct {
	bucket int
	topic  string // empty for the wake channel
}

// newNotifier makes the notifier; ctx carries values only, its end is
// ignored: the notifier lives until close.
func newNotifier(ctx context.Context, env notifierEnv) *notifier {
	n := &notifier{
		env:     env,
		subs:    map[int]*subscription{},
		routes:  map[string]route{},
		topics:  map[string]*topicWatch{},
		watched: map[string]bool{},
	}
	n.ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return n
}

// listenForHandlers subscribes to every bucket's wake channel, for the
// bucket handlers hs (by bucket).
func (n *notifier) listenForHandlers(hs []bucketWaker) error {
	n.mu.Lock()
	n.handlers = hs
	n.mu.Unlock()
	channels := map[string]route{}
	for b := range n.env.buckets {
		channels[n.env.wakeChannel(b)] = route{bucket: b}
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
	for b := range n.env.buckets {
		channels[n.env.readyChannel(b, topic)] = route{bucket: b, topic: topic}
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
		w = newTopicWatch(n.env.buckets)
		n.topics[topic] = w
	}
	return w
}

// dispatch delivers a wake-up; resync wakes everyone behind the channel.
func (n *notifier) dispatch(channel, payload string, resync bool) {
	n.mu.Lock()
	r, ok := n.routes[channel]
	var h bucketWaker
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
	case resync || payload == resumeMessage:
		if n.env.resynced != nil {
			n.env.resynced()
		}
		w.notify(r.bucket, math.MaxInt32)
	default:
		payload, mark, _ := strings.Cut(payload, ":")
		if h != nil && mark != "" && h.wokeFromReply(mark, r.topic) {
			return // this process's bucket handler woke its consumers from the move's reply
		}
		count, err := strconv.Atoi(payload)
		if err != nil {
			count = 1
		}
		w.notify(r.bucket, count)
	}
}

// wakeReady wakes this process's Pops of topic for count jobs that became
// ready in bucket b, as a notification of them would.
func (n *notifier) wakeReady(b int, topic string, count int) {
	n.mu.Lock()
	w := n.topics[topic]
	n.mu.Unlock()
	if w != nil {
		w.notify(b, count)
	}
}

// notifierLocked returns the queue's pub/sub listener, making it on first
// use. q.mu must be held.
func (q *DelayQueue) notifierLocked(ctx context.Context) *notifier {
	if q.notes == nil {
		q.notes = newNotifier(ctx, notifierEnv{
			client:       q.client,
			sharded:      q.pub == "SPUBLISH",
			buckets:      q.opts.buckets,
			poll:         q.opts.poll,
			readTimeout:  q.readTimeout,
			logger:       q.opts.logger,
			wakeChannel:  func(b int) string { return q.keys.bucket(b).wake },
			readyChannel: func(b int, topic string) string { return q.keys.bucket(b).readyChannel(topic) },
			slotMoved:    func(ctx context.Context) { q.noteError(ctx, errSlotMoved) },
			resynced:     q.pauses.invalidate,
		})
	}
	return q.notes
}

// errSlotMoved stands for Redis dropping a sharded subscription.
var errSlotMoved = errors.New("delayqueue: sharded subscription dropped: slot moved")

// notifier returns the queue's notifier, made on first use; ErrClosed after
// Close.
func (q *DelayQueue) notifier(ctx context.Context) (*notifier, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return nil, ErrClosed
	}
	return q.notifierLocked(ctx), nil
}
