package delayqueue

import (
	"context"
	"encoding/binary"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
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
		_, body, _ := strings.Cut(string(src), "\n") // the flags line
		full := preludeFor(string(prelude), body) + "\n" + body
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

// TestRestateRewritesTheHeaderAndKeepsTheRest runs job.lua's restate on
// Redis's Lua and miniredis's, and checks its output byte by byte against
// the header's layout: the state bits, attempts (capped), at_ms and reservation
// change as asked, every other byte stays.
func TestRestateRewritesTheHeaderAndKeepsTheRest(t *testing.T) {
	script := jobScript(t, `return restate(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))`)
	jobs := codecSamples()
	type change struct {
		state                 State
		at                    int64
		attempts, reservation int64 // -1: unchanged
	}
	changes := []change{
		{StateReady, 1700000000123, -1, -1},
		{StateReserved, 1<<48 - 1, 1, 1},
		{StateReserved, 0, 65535, 1<<48 - 1},
		{StateReserved, 1234567890123, 70000, 987654321}, // attempts cap at 65,535
		{StateDelayed, 42, 256, 65536},
	}
	want := func(v []byte, c change) []byte {
		out := slices.Clone(v)
		out[0] = out[0]&^7 | byte(c.state)
		if c.attempts >= 0 {
			binary.BigEndian.PutUint16(out[1:3], uint16(min(c.attempts, 65535)))
		}
		put48 := func(b []byte, n int64) {
			var buf [8]byte
			binary.BigEndian.PutUint64(buf[:], uint64(n))
			copy(b, buf[2:])
		}
		put48(out[9:15], c.at)
		if c.reservation >= 0 {
			put48(out[15:21], c.reservation)
		}
		return out
	}
	arg := func(n int64) string {
		if n < 0 {
			return ""
		}
		return strconv.FormatInt(n, 10)
	}
	eachLua(t, func(t *testing.T, client redis.UniversalClient) {
		for name, v := range jobs {
			for _, c := range changes {
				got, err := script.Run(context.Background(), client, nil,
					v, int(c.state), c.at, arg(c.attempts), arg(c.reservation)).Text()
				require.NoError(t, err)
				assert.Equal(t, want(v, c), []byte(got), "%s, %+v", name, c)
				_, err = decodeJob("x", []byte(got))
				assert.NoError(t, err, "%s, %+v", name, c)
			}
		}
	})
}

// TestDecodeThenEncodeKeepsEveryByte runs job.lua's decode and encode on
// Redis's Lua and miniredis's: what a script does not change comes out as
// it went in, headers included, which Lua never reads.
func TestDecodeThenEncodeKeepsEveryByte(t *testing.T) {
	script := jobScript(t, `return encode(decode(ARGV[1]))`)
	eachLua(t, func(t *testing.T, client redis.UniversalClient) {
		for name, v := range codecSamples() {
			got, err := script.Run(context.Background(), client, nil, v).Text()
			require.NoError(t, err)
			assert.Equal(t, v, []byte(got), name)
		}
	})
}

// jobScript makes a script of src and the job.lua helpers it calls.
func jobScript(t *testing.T, src string) *redis.Script {
	prelude, err := scriptFiles.ReadFile("scripts/job.lua")
	require.NoError(t, err)
	return redis.NewScript(preludeFor(string(prelude), src) + "\n" + src)
}

// eachLua runs f against miniredis's Lua and a real redis-server's.
func eachLua(t *testing.T, f func(t *testing.T, client redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) { f(t, miniredisClient(t)) })
	t.Run("redis", func(t *testing.T) { f(t, redistest.Shared(t).Client(t)) })
}

// codecSamples are encoded jobs with each optional field and without.
func codecSamples() map[string][]byte {
	withError := []byte{jobFormat | byte(StateReserved) | jobHasError, 0, 2, 0, 5, 0, 0, 0x05, 0xdc}
	withError = append(withError, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 0, 0, 4, 5, 0, 4)
	withError = append(withError, "topicboombo\ndy"...)
	headers := encodeHeaders(traceHeaders)
	// Every optional field, a last error and headers.
	everything := []byte{jobFormat | byte(StateReserved) | jobHasError | jobHasWindow | jobHasNonce | jobHasHeaders, 0, 2, 0, 5, 0, 0, 0x05, 0xdc}
	everything = append(everything, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 0, 0, 4, 5, 0, 4)
	everything = append(everything, 0, 0, 0x27, 0x10, 0xde, 0xad, 0xbe, 0xef) // window 10 s, nonce
	everything = binary.BigEndian.AppendUint16(everything, uint16(len(headers)))
	everything = append(everything, "topicboom"...)
	everything = append(everything, headers...)
	everything = append(everything, "bo\ndy"...)
	return map[string][]byte{
		"plain":           encodeJob("t", []byte("body"), 1500, 3, 0, 0, 0, nil),
		"every field":     encodeJob("orders", []byte{0, '\n', 255}, 1<<32-1, 65535, 1<<48-1, 1<<32-1, 1<<32-1, nil),
		"headers":         encodeJob("t", []byte("body"), 1500, 3, 0, 0, 0, headers),
		"last error":      withError,
		"everything":      everything,
		"empty body":      encodeJob("t", nil, 1500, 3, 0, 0, 7, headers),
		"largest headers": encodeJob("t", []byte("b"), 1, 1, 0, 0, 0, encodeHeaders(map[string]string{"k": strings.Repeat("v", maxHeadersSize-1)})),
	}
}
