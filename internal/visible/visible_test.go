package visible

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"orders.paid":          "orders.paid",
		`C:\temp\job`:          `C:\temp\job`,
		"émoji.☃ spaced":       "émoji.☃ spaced",
		"invoice\u202egpj.exe": `invoice\u202egpj.exe`,
		"two\nlines":           `two\nlines`,
		"nul\x00":              `nul\x00`,
		"bad\xffbyte":          `bad\xffbyte`,
		"a real \ufffd":        "a real \ufffd",
		"zero\u200bwidth":      `zero\u200bwidth`,
	} {
		assert.Equal(t, want, Escape(in), "%q", in)
	}
}
