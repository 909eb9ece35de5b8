package delayqueue

import (
	"context"
	"encoding/binary"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/dqueue/delayqueue/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
)

func TestIncludesComeOnceEachAfterWhatTheyInclude(t *testing.T) {
	files := fstest.MapFS{
		"scripts/s.lua":     {Data: []byte("#!lua flags=allow-oom\n--#include a\n--#include b c\nreturn a()\n")},
		"scripts/lib/a.lua": {Data: []byte("--#include b\n-- a.lua\nlocal function a() return b() end\n")},
		"scripts/lib/b.lua": {Data: []byte("--#include c\nlocal function b() return c end\n")},
		"scripts/lib/c.lua": {Data: []byte("local c = 1\n")},
	}
	flags, code, err := assembleScript(files, "s.lua")
	require.NoError(t, err)
	assert.Equal(t, "#!lua flags=allow-oom", flags)
	assert.Equal(t, "local c = 1\nlocal function b() return c end\nlocal function a() return b() end\nreturn a()\n", code,
		"each library once, after the libraries it includes, without its comments, then the script without its include lines")
}

func TestAMissingOrCyclicIncludeIsAnError(t *testing.T) {
	for name, files := range map[string]fstest.MapFS{
		"missing": {
			"scripts/s.lua":     {Data: []byte("#!lua\n--#include a\nreturn 1\n")},
			"scripts/lib/a.lua": {Data: []byte("--#include gone\nlocal a = 1\n")},
		},
		"cycle": {
			"scripts/s.lua":     {Data: []byte("#!lua\n--#include a\nreturn 1\n")},
			"scripts/lib/a.lua": {Data: []byte("--#include b\nlocal a = 1\n")},
			"scripts/lib/b.lua": {Data: []byte("--#include c\nlocal b = 1\n")},
			"scripts/lib/c.lua": {Data: []byte("--#include a\nlocal c = 1\n")},
		},
		"itself": {
			"scripts/s.lua":     {Data: []byte("#!lua\n--#include a\nreturn 1\n")},
			"scripts/lib/a.lua": {Data: []byte("--#include a\nlocal a = 1\n")},
		},
		"no flags line": {
			"scripts/s.lua": {Data: []byte("--#include a\nreturn 1\n")},
		},
	} {
		_, _, err := assembleScript(files, "s.lua")
		assert.Error(t, err, name)
	}
	assert.Panics(t, func() { loadScript("gone.lua") }, "at init")
}

// luaGlobals are the globals a script may use: what Redis gives it. Any
// other global is a helper that no include defines, or a typo.
var luaGlobals = []string{"redis", "KEYS", "ARGV", "math", "string", "table", "cjson", "bit",
	"tonumber", "tostring", "type", "unpack", "ipairs", "pairs", "next", "select", "error", "pcall", "assert"}

func TestEveryScriptDefinesEveryNameItUses(t *testing.T) {
	for name, code := range eachLuaFile(t) {
		chunk, err := parse.Parse(strings.NewReader(code), name)
		require.NoError(t, err, name)
		proto, err := lua.Compile(chunk, name)
		require.NoError(t, err, name)
		for _, g := range globalsOf(proto) {
			assert.Contains(t, luaGlobals, g, "%s uses a global that is not Redis's", name)
		}
	}
}

func TestEveryIncludeIsUsed(t *testing.T) {
	names, err := fs.Glob(scriptFiles, "scripts/*.lua")
	require.NoError(t, err)
	libs, err := fs.Glob(scriptFiles, "scripts/lib/*.lua")
	require.NoError(t, err)
	for _, name := range append(names, libs...) {
		src, err := scriptFiles.ReadFile(name)
		require.NoError(t, err)
		text := string(src)
		if !strings.HasPrefix(name, "scripts/lib/") {
			_, text, _ = strings.Cut(text, "\n") // the flags line
		}
		includes, code := cutIncludes(text)
		used := luaNames(code)
		for _, lib := range includes {
			text, err := scriptFiles.ReadFile("scripts/lib/" + lib + ".lua")
			require.NoError(t, err)
			_, libCode := cutIncludes(string(text))
			defined := luaDefined(libCode)
			require.NotEmpty(t, defined, lib)
			assert.True(t, slices.ContainsFunc(defined, func(n string) bool { return used[n] }),
				"%s includes %s and uses none of %v", name, lib, defined)
		}
	}
}

// TestScriptRepliesAreGos checks that each script names its reply codes as
// replies.go does, with the same numbers, and no code Go does not name.
func TestScriptRepliesAreGos(t *testing.T) {
	goCodes := map[string]map[string]int64{
		"push.lua":   {"PUSH_CREATED": pushCreated, "PUSH_EXISTED": pushExisted, "PUSH_TAKEN": pushTaken},
		"upsert.lua": {"UPSERT_CREATED": upsertCreated, "UPSERT_REPLACED": upsertReplaced},
		"move.lua": {"MOVE_NEITHER": moveNeither, "MOVE_STANDBY": moveStandby, "MOVE_SECOND": moveSecond, "MOVE_FRESH": moveFresh, "MOVE_VACATED": moveVacated, "MOVE_SOONER": moveSooner,
			"MOVE_REPLAN_MS": replanBy.Milliseconds()},
		"reserve.lua": {"RESERVE_RAN_OUT": int64(reserveRanOut), "RESERVE_FILLED": int64(reserveFilled),
			"RESERVE_STALE": int64(reserveStale), "RESERVE_PAUSED": int64(reservePaused), "RESERVE_NO_SIGNAL": reserveNoSignal,
			"RESERVE_DRY": reserveDry, "RESERVE_UNCLAIMED": int64(reserveUnclaimed),
			"RESERVE_GREEDY": int64(reserveGreedy), "RESERVE_CLAIM": int64(reserveClaim), "RESERVE_LOST": int64(reserveLost)},
		"lib/finish.lua": {"FINISH_DONE": finishDone, "FINISH_NO_JOB": finishNoJob,
			"FINISH_NOT_RESERVED": finishNotReserved, "FINISH_LOST": finishLost},
		"lib/held.lua":   {"HELD_NO_JOB": heldNoJob, "HELD_LOST": heldLost},
		"retry.lua":      {"RETRY_AGAIN": retryAgain, "RETRY_DIED": retryDied},
		"release.lua":    {"RELEASE_DONE": releaseDone},
		"touch.lua":      {"TOUCH_NO_JOB": touchNoJob, "TOUCH_LOST": touchLost},
		"reschedule.lua": {"RESCHEDULE_DONE": rescheduleDone, "RESCHEDULE_NO_JOB": rescheduleNoJob, "RESCHEDULE_NOT_PENDING": rescheduleNotPending},
		"remove.lua":     {"REMOVE_DONE": removeDone, "REMOVE_NO_JOB": removeNoJob},
		"unlock.lua":     {"UNLOCK_RELEASED": unlockReleased, "UNLOCK_NOT_HELD": unlockNotHeld},
		"schedule.lua":   {"SCHEDULE_CHANGED": scheduleChanged, "SCHEDULE_NOT_AS_READ": scheduleNotAsRead},
		"acquire.lua":    {"ACQUIRE_NO_LIMITS": acquireNoLimits},
		"renew.lua":      {"RENEW_DONE": renewDone, "RENEW_KEPT": renewKept},
	}
	code := regexp.MustCompile(`(?m)^local ([A-Z][A-Z_]*) = (-?[0-9]+)`)
	for name, want := range goCodes {
		src, err := scriptFiles.ReadFile("scripts/" + name)
		require.NoError(t, err)
		got := map[string]int64{}
		prefix := strings.ToUpper(strings.TrimSuffix(path.Base(name), ".lua")) + "_"
		for _, m := range code.FindAllStringSubmatch(string(src), -1) {
			if strings.HasPrefix(m[1], prefix) {
				got[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
			}
		}
		assert.Equal(t, want, got, name)
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

// TestRestateRewritesTheHeaderAndKeepsTheRest runs lib/header.lua's restate on
// Redis's Lua and miniredis's, and checks its output byte by byte against
// the header's layout: the state bits, attempts (capped), at_ms and reservation
// change as asked, every other byte stays.
func TestRestateRewritesTheHeaderAndKeepsTheRest(t *testing.T) {
	script := jobScript(t, "--#include header\n"+`return restate(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))`)
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

// TestDecodeThenEncodeKeepsEveryByte runs lib/decode.lua's decode and encode on
// Redis's Lua and miniredis's: what a script does not change comes out as
// it went in, headers included, which Lua never reads.
func TestDecodeThenEncodeKeepsEveryByte(t *testing.T) {
	script := jobScript(t, "--#include decode\nreturn encode(decode(ARGV[1]))")
	eachLua(t, func(t *testing.T, client redis.UniversalClient) {
		for name, v := range codecSamples() {
			got, err := script.Run(context.Background(), client, nil, v).Text()
			require.NoError(t, err)
			assert.Equal(t, v, []byte(got), name)
		}
	})
}

// jobScript makes a script of src and the library files it includes.
func jobScript(t *testing.T, src string) *redis.Script {
	code, err := withIncludes(scriptFiles, "test", src)
	require.NoError(t, err)
	return redis.NewScript(code)
}

// eachLuaFile returns the code of every script, as loadScript assembles it
// (without its flags line), and of every library with what it includes,
// by file name.
func eachLuaFile(t *testing.T) map[string]string {
	out := map[string]string{}
	names, err := fs.Glob(scriptFiles, "scripts/*.lua")
	require.NoError(t, err)
	for _, name := range names {
		_, code, err := assembleScript(scriptFiles, path.Base(name))
		require.NoError(t, err)
		out[name] = code
	}
	libs, err := fs.Glob(scriptFiles, "scripts/lib/*.lua")
	require.NoError(t, err)
	for _, name := range libs {
		code, err := withIncludes(scriptFiles, name, includeLine+strings.TrimSuffix(path.Base(name), ".lua")+"\n")
		require.NoError(t, err)
		out[name] = code
	}
	return out
}

var (
	luaComment = regexp.MustCompile(`--.*`)
	luaName    = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	luaLocal   = regexp.MustCompile(`(?m)^local (?:function )?([A-Za-z_][A-Za-z0-9_, ]*)`)
)

// luaNames is the set of names Lua code uses outside its comments.
func luaNames(code string) map[string]bool {
	names := map[string]bool{}
	for _, n := range luaName.FindAllString(luaComment.ReplaceAllString(code, ""), -1) {
		names[n] = true
	}
	return names
}

// luaDefined lists the names a library's top-level locals define.
func luaDefined(code string) []string {
	var out []string
	for _, m := range luaLocal.FindAllStringSubmatch(code, -1) {
		for _, n := range strings.Split(m[1], ",") {
			out = append(out, strings.TrimSpace(n))
		}
	}
	return out
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

// assembleScript is assembleParts with the code in one piece, as it runs.
func assembleScript(files fs.FS, name string) (flags, code string, err error) {
	flags, libs, body, err := assembleParts(files, name)
	return flags, joinCode(libs, body), err
}

// withIncludes is includedLibs with the code in one piece.
func withIncludes(files fs.FS, name, src string) (string, error) {
	libs, body, err := includedLibs(files, name, src)
	return joinCode(libs, body), err
}
