package tcpproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echo starts a server that sends back every line it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	assert.Equal(t, "ping\n", line)
	return time.Since(start), nil
}

func TestDelayAddsToEachWay(t *testing.T) {
	p, err := Start(echo(t), true)
	require.NoError(t, err)
	defer p.Close()
	p.SetDelay(30 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	for range 3 {
		d, err := roundTrip(t, c, r)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, d, 60*time.Millisecond, "a round trip takes the delay twice")
	}
	p.SetDelay(0)
	_, err = roundTrip(t, c, r) // the first goes with the delay it was read with
	require.NoError(t, err)
	d, err := roundTrip(t, c, r)
	require.NoError(t, err)
	assert.Less(t, d, 30*time.Millisecond)
}

func TestCutClosesDelayedConnections(t *testing.T) {
	p, err := Start(echo(t), true)
	require.NoError(t, err)
	defer p.Close()
	p.SetDelay(20 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	_, err = roundTrip(t, c, r)
	require.NoError(t, err)
	p.SetUp(false)
	p.SetUp(true)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = r.ReadString('\n')
	require.Error(t, err)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "a cut connection ends at once, it does not go silent")

	c2, err := net.Dial("tcp", p.Addr) // the relay still accepts
	require.NoError(t, err)
	defer c2.Close()
	_, err = roundTrip(t, c2, bufio.NewReader(c2))
	require.NoError(t, err)
}
