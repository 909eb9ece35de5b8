package dashboard

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBackTo(t *testing.T) {
	for _, c := range []struct{ prefix, to, want string }{
		{"", "/", "/"},
		{"", "/topics/mail?state=dead", "/topics/mail?state=dead"},
		{"", "//evil.example", "/"},
		{"", "/jobs/..", "/"},
		{"", "/jobs/%2E%2e", "/"},
		{"/q", "/q/jobs/a%2Fb", "/q/jobs/a%2Fb"},
		{"/q", "/jobs/x", "/q/"},
		{"/q", "/q", "/q/"},
		{"/q", "/qq/", "/q/"},
		{"/q", "/q/a b", "/q/"},
		{"/q", "/q/%zz", "/q/"},
	} {
		assert.Equal(t, c.want, backTo(c.prefix, c.to), "%q under %q", c.to, c.prefix)
	}
}
