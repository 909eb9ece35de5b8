package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/spf13/cobra"
)

func (a *app) serveCommand() *cobra.Command {
	var (
		listen   string
		prefix   string
		readOnly bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the web dashboard",
		Long: `Serve the web dashboard on --listen until Ctrl-C, under --prefix when given;
with --read-only it shows the queue and changes nothing. It listens on
loopback by default: put it behind authentication before listening
anywhere else.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix = strings.TrimSuffix(prefix, "/")
			if !validPrefix(prefix) {
				return usagef("--prefix %q: a path such as /admin/queue, of letters, digits, - _ . ~ and /", prefix)
			}
			return a.onQueue(func(ctx context.Context, q *delayqueue.DelayQueue, _ []string) error {
				d := dashboard.New(q, dashboard.Options{ReadOnly: readOnly, Prefix: prefix})
				mux := http.NewServeMux()
				mux.Handle(prefix+"/", http.StripPrefix(prefix, d))
				return a.serve(ctx, listen, prefix, mux)
			})(cmd, args)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "`address` to listen on")
	cmd.Flags().StringVar(&prefix, "prefix", "", "`path` to serve the dashboard under, such as /admin/queue")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "show the queue, allow no change")
	return cmd
}

// validPrefix reports whether p (without its trailing slash) is a path the
// dashboard can be served under as it is written: clean, and of characters
// that stand for themselves in a URL and in a ServeMux pattern.
func validPrefix(p string) bool {
	if p == "" {
		return true
	}
	if p == "/" || path.Clean(p) != p || !strings.HasPrefix(p, "/") { // "/" is what "//" leaves
		return false
	}
	for _, r := range p {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("/-_.~", r):
		default:
			return false
		}
	}
	return true
}

// serve serves h on addr, its dashboard under prefix, until ctx ends, then
// shuts down gracefully.
func (a *app) serve(ctx context.Context, addr, prefix string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(a.stderr, "dqctl: serving the dashboard of queue %s on http://%s%s/\n", a.conn.queue, ln.Addr(), prefix)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
