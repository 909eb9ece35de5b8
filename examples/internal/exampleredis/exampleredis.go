// Package exampleredis gives the examples a Redis client: a real Redis at
// $REDIS_ADDR, or else an embedded miniredis, so that they run anywhere.
package exampleredis

import (
	"fmt"
	"os"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Client returns a client and a function that closes it (and the embedded
// server, if any).
func Client() (*redis.Client, func(), error) {
	addr := os.Getenv("REDIS_ADDR")
	stop := func() {}
	if addr == "" {
		srv, err := miniredis.Run()
		if err != nil {
			return nil, nil, fmt.Errorf("start miniredis: %w", err)
		}
		addr, stop = srv.Addr(), srv.Close
		fmt.Println("using an embedded miniredis; set REDIS_ADDR to use a real Redis")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	return c, func() { _ = c.Close(); stop() }, nil
}
