package dashboard

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSegment(t *testing.T) {
	for name, want := range map[string]string{
		"mail":     "mail",
		"~2Ab":     "~2Ab", // the queue's own IDs
		"a.b..c":   "a.b..c",
		"a b?c#d":  "a%20b%3Fc%23d",
		"ü":        "%C3%BC",
		".":        "!Lg",
		"..":       "!Li4",
		"a/b":      "!YS9i",
		"a\\b":     "!YVxi",
		"100%":     "!MTAwJQ",
		"!":        "!IQ",
		"a!":       "a%21",
		"%2e%2e":   "!JTJlJTJl",
		"a/../b/.": "!YS8uLi9iLy4",
	} {
		assert.Equal(t, want, segment(name), "%q", name)
	}
	for _, bad := range []string{"!", "!!", "!Lg=", "!a"} {
		_, ok := unsegment(bad)
		assert.False(t, ok, "%q", bad)
	}
}

// FuzzSegment: a name's segment reads back as the name, and neither it nor
// its unescaped form is anything a browser, a proxy or a router cleans or
// splits: no dot segment, no '/', '\' or '%'.
func FuzzSegment(f *testing.F) {
	for _, s := range []string{"mail", ".", "..", "...", "a/b", "!x", "%2e", "a/../b", "~26x", strings.Repeat("é", 100), "\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" {
			return
		}
		seg := segment(name)
		raw, err := url.PathUnescape(seg)
		require.NoError(t, err)
		got, ok := unsegment(raw)
		require.True(t, ok)
		require.Equal(t, name, got)
		for _, s := range []string{seg, raw} {
			require.NotContains(t, []string{".", ".."}, s)
			require.False(t, strings.ContainsAny(s, `/\`), "%q", s)
		}
		require.NotContains(t, raw, "%")
	})
}

func TestBackTo(t *testing.T) {
	for _, c := range []struct{ prefix, to, want string }{
		{"", "/", "/"},
		{"", "/topics/mail?state=dead", "/topics/mail?state=dead"},
		{"", "//evil.example", "/"},
		{"", "/jobs/..", "/"},
		{"", "/jobs/%2E%2e", "/"},
		{"/q", "/q/jobs/!Li4", "/q/jobs/!Li4"},
		{"/q", "/jobs/x", "/q/"},
		{"/q", "/q", "/q/"},
		{"/q", "/qq/", "/q/"},
		{"/q", "/q/a b", "/q/"},
		{"/q", "/q/%zz", "/q/"},
	} {
		assert.Equal(t, c.want, backTo(c.prefix, c.to), "%q under %q", c.to, c.prefix)
	}
}
