package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startServe runs dqctl serve on a free port and returns the dashboard's
// URL; the server is interrupted, and must exit 0, when the test ends.
func startServe(t *testing.T, f *fixture, extra ...string) string {
	t.Helper()
	args := append(append(append([]string{}, f.flags...), "serve", "--listen", "127.0.0.1:0"), extra...)
	cmd := exec.Command(binPath, args...)
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewReader(stderr)
	line, err := lines.ReadString('\n')
	require.NoError(t, err)
	addr := regexp.MustCompile(`on (http://\S+/)`).FindStringSubmatch(line)
	require.NotNil(t, addr, "stderr: %s", line)
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(os.Interrupt))
		_, _ = io.Copy(io.Discard, lines)
		require.NoError(t, cmd.Wait(), "serve ends cleanly on an interrupt")
	})
	return addr[1]
}

// get fetches u and returns its status and body.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestServeShowsTheDashboard(t *testing.T) {
	f := serverFixture(t)
	base := startServe(t, f)
	code, page := get(t, base)
	require.Equal(t, http.StatusOK, code)
	for _, topic := range []string{"orders", "mail", "paused"} {
		assert.Contains(t, page, topic)
	}
	assert.Contains(t, page, `<form method="post"`, "buttons to act")
	code, page = get(t, base+"jobs/"+url.PathEscape(f.delayed))
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, "later", "the job's body")
	f.noLeases(t)
}

func TestServeReadOnlyRefusesActions(t *testing.T) {
	f := serverFixture(t)
	base := startServe(t, f, "--read-only")
	code, page := get(t, base)
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, page, `<form method="post"`, "no buttons")
	resp, err := http.Post(base+"topics/orders/pause", "application/x-www-form-urlencoded", strings.NewReader(""))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	ov, err := f.q.Overview(context.Background())
	require.NoError(t, err)
	paused := ov.Paused
	assert.Equal(t, []string{"paused"}, paused)
}

func TestServeUnderAPrefix(t *testing.T) {
	f := serverFixture(t)
	base := startServe(t, f, "--prefix", "/admin/queue/")
	require.True(t, strings.HasSuffix(base, "/admin/queue/"), base)
	code, page := get(t, base)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `href="/admin/queue/topics/orders"`, "links under the prefix")
	code, _ = get(t, strings.TrimSuffix(base, "admin/queue/"))
	assert.Equal(t, http.StatusNotFound, code, "nothing outside it")

	for _, bad := range []string{"admin", "/a b", "/a/{$}", "/{x}", "//", "/a//b", "/a/../b", "/a%20b", "/é", "/a?b"} {
		r := f.run(t, "serve", "--listen", "127.0.0.1:0", "--prefix", bad)
		assert.Equal(t, exitUsage, r.code, "%q: %s", bad, r.stderr)
		assert.Contains(t, r.stderr, "--prefix", bad)
	}
}
