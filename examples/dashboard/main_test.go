package main

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunServesTheDashboard starts the example on a free port, reads the
// overview, and stops it as Ctrl-C does.
func TestRunServesTheDashboard(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, "127.0.0.1:0", func(url string) { urls <- url }) }()
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		t.Fatal("run returned before serving:", err)
	}
	resp, err := http.Get(url)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	for _, topic := range []string{"report", "billing/eu"} {
		assert.Contains(t, string(body), `data-topic="`+topic+`"`)
	}
	assert.Contains(t, string(body), "badge paused")
	cancel()
	require.NoError(t, <-done)
	http.DefaultClient.CloseIdleConnections()
}
