package delayqueue

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEachScriptCarriesTheHelpersItCallsAndNoOthers(t *testing.T) {
	prelude := `-- job.lua
local READY = 2
local floor = math.floor

-- leaf helps only
local function leaf(x)
  return x + 1
end

-- mid calls leaf
local function mid(x)
  return leaf(x) * 2
end

-- unused names mid only in this comment
local function unused()
  return 0
end
`
	helpers := regexp.MustCompile(`local function (\w+)`)
	names := func(src string) []string {
		var out []string
		for _, m := range helpers.FindAllStringSubmatch(src, -1) {
			out = append(out, m[1])
		}
		return out
	}
	assert.Equal(t, []string{"leaf", "mid"}, names(preludeFor(prelude, "return mid(READY)")),
		"a helper the script calls, and the helper that one calls")
	assert.Empty(t, names(preludeFor(prelude, "-- mid(READY) is not called here\nreturn READY")),
		"a name in a comment calls nothing")
	kept := preludeFor(prelude, "return 1")
	assert.Contains(t, kept, "local READY = 2", "constants stay")
	assert.Contains(t, kept, "local floor = math.floor")
}
