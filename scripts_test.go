package delayqueue

import (
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
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

// luaGlobals are the globals a script may use: what Redis gives it. Any
// other global is a helper that preludeFor left out, or a typo.
var luaGlobals = []string{"redis", "KEYS", "ARGV", "math", "string", "table", "cjson", "bit",
	"tonumber", "tostring", "type", "unpack", "ipairs", "pairs", "next", "select", "error", "pcall", "assert"}

func TestEveryScriptDefinesEveryNameItUses(t *testing.T) {
	prelude, err := scriptFiles.ReadFile("scripts/job.lua")
	require.NoError(t, err)
	names, err := fs.Glob(scriptFiles, "scripts/*.lua")
	require.NoError(t, err)
	for _, name := range names {
		if name == "scripts/job.lua" {
			continue
		}
		src, err := scriptFiles.ReadFile(name)
		require.NoError(t, err)
		full := preludeFor(string(prelude), string(src)) + "\n" + string(src)
		chunk, err := parse.Parse(strings.NewReader(full), name)
		require.NoError(t, err, name)
		proto, err := lua.Compile(chunk, name)
		require.NoError(t, err, name)
		for _, g := range globalsOf(proto) {
			assert.Contains(t, luaGlobals, g, "%s uses a global that is not Redis's", name)
		}
	}
}

// globalsOf lists the globals a compiled chunk reads or writes, in its own
// code and its functions'. (gopher-lua keeps an instruction's opcode in its
// top 6 bits and Bx, here the constant naming the global, in its low 18.)
func globalsOf(p *lua.FunctionProto) []string {
	var out []string
	for _, inst := range p.Code {
		if op := int(inst >> 26); op == lua.OP_GETGLOBAL || op == lua.OP_SETGLOBAL {
			out = append(out, p.Constants[inst&0x3ffff].String())
		}
	}
	for _, f := range p.FunctionPrototypes {
		out = append(out, globalsOf(f)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
