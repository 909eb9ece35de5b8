package dashboard_test

import (
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/dqueue/delayqueue"
	"github.com/dqueue/delayqueue/dashboard"
	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scheduleRow is the overview's row of the schedule named name.
func scheduleRow(t *testing.T, page, name string) string {
	t.Helper()
	row := regexp.MustCompile(`(?s)<tr data-schedule="` + regexp.QuoteMeta(name) + `">.*?</tr>`).FindString(page)
	require.NotEmpty(t, row, "no row for schedule %s", name)
	return row
}

func TestOverviewListsSchedules(t *testing.T) {
	redistest.ForEach(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		q := newQueue(t, c)
		berlin, err := time.LoadLocation("Europe/Berlin")
		require.NoError(t, err)
		require.NoError(t, q.Schedule(ctx, delayqueue.Schedule{Name: "digest", Cron: "0 8 * * *", Location: berlin, Job: delayqueue.Job{Topic: "mail"}}))
		require.NoError(t, q.Schedule(ctx, delayqueue.Schedule{Name: "sweep", Every: 10 * time.Minute, Paused: true, Job: delayqueue.Job{Topic: "carts"}}))
		list, err := q.Schedules(ctx)
		require.NoError(t, err)
		require.Len(t, list, 2)
		s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "/admin/queue")

		code, page := s.get("/")
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "Schedules: 2")
		digest := scheduleRow(t, page, "digest")
		assert.Contains(t, digest, "cron <code>0 8 * * *</code>")
		assert.Contains(t, digest, "<td>Europe/Berlin</td>")
		assert.Contains(t, digest, `<a href="/admin/queue/topics/mail">mail</a>`)
		assert.Contains(t, digest, list[0].Next.UTC().Format("2006-01-02 15:04:05.000Z"), "the next tick")
		assert.Contains(t, digest, "running")
		sweep := scheduleRow(t, page, "sweep")
		assert.Contains(t, sweep, "every 10m0s")
		assert.Contains(t, sweep, "<td>UTC</td>")
		assert.Contains(t, sweep, "badge paused")
	})
}

func TestScheduleNamesInjectNoMarkup(t *testing.T) {
	q := newQueue(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	require.NoError(t, q.Schedule(ctx, delayqueue.Schedule{Name: scriptTag, Every: time.Hour, Job: delayqueue.Job{Topic: scriptTag}}))
	s := serve(t, dashboard.New(q, dashboard.Options{Logger: discard}), "")

	_, page := s.get("/")
	assert.NotContains(t, page, "<script>")
	assert.Contains(t, page, "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>")
	assert.Contains(t, page, `">&lt;script&gt;alert(1)&lt;/script&gt;</a>`, "its topic")
}

func TestOverviewOfAQueueWithoutSchedulesListsNone(t *testing.T) {
	s := serve(t, dashboard.New(newTopicsQueue("a"), dashboard.Options{Logger: discard}), "")
	code, page := s.get("/")
	require.Equal(t, http.StatusOK, code, page)
	assert.NotContains(t, page, `id="schedules"`)
}
