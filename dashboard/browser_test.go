package dashboard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBrowser drives a headless Chromium against a dashboard on a real
// Redis: it reads the overview's counts, opens a job whose body is a
// script and checks that it shows as text and runs nothing, clicks
// requeue and pause, and opens and removes jobs whose IDs and topics are
// ".", ".." and "a/b" by clicking through the pages. With
// DQ_SCREENSHOTS=dir it saves the pages it sees there (the screenshots in
// docs/ come from it).
func TestBrowser(t *testing.T) {
	if os.Getenv("DQ_BROWSER") != "1" {
		t.Skip("set DQ_BROWSER=1 to drive headless Chromium against the dashboard (.ci/run does)")
	}
	bin := os.Getenv("DQ_CHROMIUM")
	if bin == "" {
		var err error
		bin, err = exec.LookPath("chromium")
		require.NoError(t, err, "DQ_BROWSER=1 needs chromium on PATH (apt-get install chromium) or DQ_CHROMIUM")
	}
	c := redistest.Shared(t).Client(t)
	name := fmt.Sprintf("browser-%d", nameSeq.Add(1))
	q := newQueue(t, c, delayqueue.WithName(name))
	ids := seed(t, q)
	twin := startedTwin(t, c, name) // keeps the history the charts show
	odd := []string{".", "..", "a/b"}
	for _, name := range odd {
		_, err := q.Push(context.Background(), &delayqueue.Job{ID: name, Topic: name, Body: []byte("odd"), Delay: time.Hour})
		require.NoError(t, err)
	}
	require.NoError(t, q.Schedule(context.Background(), delayqueue.Schedule{Name: scriptTag, Every: time.Hour, Job: delayqueue.Job{Topic: scriptTag}}))
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/admin/queue")
	base := s.srv.URL + "/admin/queue"

	// A fresh profile; Chromium's helpers may still write there when it
	// exits, so it is removed at the very end, without t.TempDir's check.
	profile, err := os.MkdirTemp("", "dq-chromium-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(profile) })
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1200, 900),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	)
	defer cancelAlloc()
	// This chromedp (the last for go 1.22) predates some of Chromium's
	// event fields: it says so for each, harmlessly.
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(format string, a ...any) {
		if !strings.HasPrefix(format, "could not unmarshal event") {
			t.Logf(format, a...)
		}
	}))
	defer cancel()
	var dialogs atomic.Int32 // each accepted
	chromedp.ListenTarget(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			go func() { _ = chromedp.Run(ctx, page.HandleJavaScriptDialog(true)) }()
		}
	})
	require.NoError(t, chromedp.Run(ctx)) // starts the browser, for the life of ctx
	// Each step may wait for the page it leads to: a page that never
	// comes fails the test instead of hanging it.
	run := func(actions ...chromedp.Action) {
		t.Helper()
		step, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		require.NoError(t, chromedp.Run(step, actions...))
	}
	shot := func(name string) chromedp.Action {
		dir := os.Getenv("DQ_SCREENSHOTS")
		return chromedp.ActionFunc(func(ctx context.Context) error {
			if dir == "" {
				return nil
			}
			var png []byte
			if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "dashboard-"+name+".png"), png, 0o644)
		})
	}

	// The overview, with a schedule whose name and topic are a script:
	// shown as text, run nowhere.
	var ready, delayed, reserved, dead, pausedRow, scheduleName string
	var overviewScripts int
	row := `tr[data-topic="mail"] `
	run(chromedp.Navigate(base+"/"), chromedp.WaitVisible(row),
		chromedp.Text(row+`a[data-count="ready"]`, &ready),
		chromedp.Text(row+`a[data-count="delayed"]`, &delayed),
		chromedp.Text(row+`a[data-count="reserved"]`, &reserved),
		chromedp.Text(row+`a[data-count="dead"]`, &dead),
		chromedp.Text(`tr[data-topic="paused"]`, &pausedRow),
		chromedp.Text(`tr[data-schedule] td`, &scheduleName),
		chromedp.Evaluate(`document.querySelectorAll("script").length`, &overviewScripts))
	assert.Equal(t, []string{"3", "1", "1", "1"}, []string{ready, delayed, reserved, dead})
	assert.Contains(t, pausedRow, "paused")
	assert.Equal(t, scriptTag, scheduleName)
	assert.Equal(t, 1, overviewScripts, "only the dashboard's own script")

	// The job whose body is a script: shown as text, run nowhere.
	var text string
	var scripts, images int
	run(chromedp.Navigate(base+jobPath(ids.script)), chromedp.WaitVisible(`#body`),
		chromedp.Text(`#body`, &text),
		chromedp.Evaluate(`document.querySelectorAll("script").length`, &scripts),
		chromedp.Evaluate(`document.querySelectorAll("img").length`, &images),
		shot("job"))
	assert.Equal(t, scriptTag+"\n"+imgTag, text)
	assert.Equal(t, 1, scripts, "only the dashboard's own script")
	assert.Zero(t, images)

	// Requeue the dead job from its topic's dead letters.
	run(chromedp.Navigate(base+topicPath("mail")+"?state=dead"), chromedp.WaitVisible(`tr[data-job]`),
		shot("dead"),
		chromedp.Click(`tr[data-job] button`), chromedp.WaitVisible(`.flash`))
	assert.Equal(t, delayqueue.StateReady, state(t, q, ids.dead))

	// Pause mail from the overview, which then reads the queue anew: its
	// charts show once the started twin has taken two samples.
	require.Eventually(t, func() bool {
		finishOne(t, twin, "work") // a queue at work is sampled every interval
		samples, err := q.History(context.Background(), "")
		return err == nil && len(samples) >= 2
	}, 15*time.Second, 50*time.Millisecond)
	run(chromedp.Navigate(base+"/"), chromedp.WaitVisible(row+`button`),
		chromedp.Click(row+`button`), chromedp.WaitVisible(`.flash`), chromedp.WaitVisible(`svg.chart`),
		chromedp.Text(row, &pausedRow), shot("overview"))
	assert.True(t, slices.Contains(paused(t, q), "mail"))
	assert.Contains(t, pausedRow, "paused")
	assert.Zero(t, dialogs.Load(), "a dialog opened")

	// Open each odd job from its topic's row and remove it: back on its
	// topic's delayed jobs.
	for i, name := range odd {
		var shown, flash, at string
		var left int
		run(chromedp.Navigate(base+"/"),
			chromedp.Click(`tr[data-topic="`+name+`"] a[data-count="delayed"]`), chromedp.WaitVisible(`tr[data-job]`),
			chromedp.Click(`tr[data-job="`+name+`"] a`), chromedp.WaitVisible(`#body`),
			chromedp.Text(`h1 .name`, &shown),
			chromedp.Click(`form[action$="/remove"] button`), chromedp.WaitVisible(`.flash`),
			chromedp.Text(`.flash`, &flash), chromedp.Location(&at),
			chromedp.Evaluate(`document.querySelectorAll("tr[data-job]").length`, &left))
		assert.Equal(t, name, shown)
		assert.Equal(t, "Removed job "+name+".", flash)
		assert.Equal(t, base+topicPath(name)+"?state=delayed", at)
		assert.Zero(t, left)
		_, err := q.Get(context.Background(), name)
		assert.ErrorIs(t, err, delayqueue.ErrNotFound, "%q", name)
		assert.Equal(t, int32(i+1), dialogs.Load(), "Remove asks first")
	}
}
