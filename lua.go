package delayqueue

import (
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua scripts/lib/*.lua
var scriptFiles embed.FS

// The scripts, each the library files it includes followed by its own file.
// redis.Script runs them by SHA and loads them on NOSCRIPT.
var (
	scriptInit       = loadScript("init.lua")
	scriptPush       = loadScript("push.lua")
	scriptMove       = loadScript("move.lua")
	scriptReserve    = loadScript("reserve.lua")
	scriptFinish     = loadScript("finish.lua")
	scriptRemove     = loadScript("remove.lua")
	scriptUnlock     = loadScript("unlock.lua")
	scriptRetry      = loadScript("retry.lua")
	scriptTouch      = loadScript("touch.lua")
	scriptRelease    = loadScript("release.lua")
	scriptReschedule = loadScript("reschedule.lua")
	scriptUpsert     = loadScript("upsert.lua")
	scriptRequeue    = loadScript("requeue.lua")
	scriptPurge      = loadScript("purge.lua")
	scriptSummary    = loadScript("summary.lua")
	scriptList       = loadScript("list.lua")
	scriptGet        = loadScript("get.lua")
	scriptTicks      = loadScript("ticks.lua")
	scriptSchedule   = loadScript("schedule.lua")
	scriptAcquire    = loadScript("acquire.lua")
	scriptGiveBack   = loadScript("giveback.lua")
	scriptRenew      = loadScript("renew.lua")
	scriptHistory    = loadScript("history.lua")
	scriptUsage      = loadScript("usage.lua")
)

// A luaScript is one script file in the forms a server may need. A file
// opens with a flags line ("#!lua flags=allow-oom", say), which Redis 7 and
// Valkey read: a script that may grow memory is refused before it writes
// when Redis is at maxmemory, one that consumes (and so frees memory) runs
// (allow-oom), and one that only reads runs too (no-writes). Those servers
// run it as a function (functions.go), or by SHA with its flags line
// (flagged) where they refuse functions. miniredis cannot parse that line:
// it gets the plain form.
type luaScript struct {
	flagged, plain *redis.Script
	// name is the file's name without ".lua", flags its flags line and
	// body its own code: what the function library is made of.
	name, flags, body string
}

// on returns the form a server takes.
func (s *luaScript) on(plain bool) *redis.Script {
	if plain {
		return s.plain
	}
	return s.flagged
}

// loadScript makes the script of a file under scripts/. Its files are
// embedded: a file that is missing, or whose includes are, panics at init.
func loadScript(name string) *luaScript {
	flags, libs, body, err := assembleParts(scriptFiles, name)
	if err != nil {
		panic(err)
	}
	code := joinCode(libs, body)
	s := &luaScript{flagged: redis.NewScript(flags + "\n" + code), plain: redis.NewScript(code),
		name: strings.TrimSuffix(name, ".lua"), flags: flags, body: body}
	allScripts = append(allScripts, s)
	return s
}

// allScripts are the scripts loadScript made, in order: the functions of
// the library (functions.go).
var allScripts []*luaScript

// isCompileError reports whether err is a server's refusal to compile a
// script, as miniredis refuses a flags line.
func isCompileError(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Error compiling script")
}

// includeLine opens a line naming library files (scripts/lib/<name>.lua)
// that a script or library uses: "--#include codec counts". Include lines
// follow a script's flags line, and open a library file.
const includeLine = "--#include "

// joinCode returns a script's code from its library files and its own lines.
func joinCode(libs, body string) string {
	if libs == "" {
		return body
	}
	return libs + "\n" + body
}

// assembleParts reads scripts/<name> from files and returns its flags line
// and its code in two parts: the library files it includes, and theirs,
// each once and after those it includes (includedLibs); and the script's
// own lines.
func assembleParts(files fs.FS, name string) (flags, libs, body string, err error) {
	src, err := fs.ReadFile(files, "scripts/"+name)
	if err != nil {
		return "", "", "", fmt.Errorf("delayqueue: %w", err)
	}
	flags, body, ok := strings.Cut(string(src), "\n")
	if !strings.HasPrefix(flags, "#!lua") || !ok {
		return "", "", "", fmt.Errorf("delayqueue: scripts/%s does not open with a #!lua line", name)
	}
	libs, body, err = includedLibs(files, name, body)
	return flags, libs, body, err
}

// includedLibs returns, for src, the code of file name: the library files
// it includes and theirs, each once, a library after those it includes,
// without their comment lines (they document the file; a script runs on
// every call what it carries, and is sent with it); and the rest of src.
// A library that is missing, or that includes itself through others, is
// an error.
func includedLibs(files fs.FS, name, src string) (libs, body string, err error) {
	const (
		visiting = 1
		done     = 2
	)
	seen := map[string]int{}
	var parts []string
	var visit func(from, lib string) error
	visit = func(from, lib string) error {
		switch seen[lib] {
		case visiting:
			return fmt.Errorf("delayqueue: %s includes lib/%s.lua, which includes it in turn: a cycle", from, lib)
		case done:
			return nil
		}
		seen[lib] = visiting
		text, err := fs.ReadFile(files, "scripts/lib/"+lib+".lua")
		if err != nil {
			return fmt.Errorf("delayqueue: %s includes %q: %w", from, lib, err)
		}
		libs, code := cutIncludes(string(text))
		for _, l := range libs {
			if err := visit("lib/"+lib+".lua", l); err != nil {
				return err
			}
		}
		seen[lib] = done
		parts = append(parts, withoutComments(code))
		return nil
	}
	names, body := cutIncludes(src)
	for _, l := range names {
		if err := visit(name, l); err != nil {
			return "", "", err
		}
	}
	return strings.Join(parts, "\n"), body, nil
}

// withoutComments returns Lua code without its comments and blank lines.
// The scripts use no long strings or long comments ([[ ]]).
func withoutComments(code string) string {
	var kept []string
	for _, line := range strings.Split(code, "\n") {
		if s := strings.TrimRight(codeOf(line), " \t"); strings.TrimSpace(s) != "" {
			kept = append(kept, s)
		}
	}
	return strings.Join(kept, "\n")
}

// codeOf returns line up to the comment it ends with: the first "--" not
// inside a quoted string.
func codeOf(line string) string {
	var quote byte
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quote != 0 && c == '\\':
			i++ // an escaped character
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(line) && line[i+1] == '-':
			return line[:i]
		}
	}
	return line
}

// cutIncludes returns the libraries named by the include lines that open
// src, and the rest of src.
func cutIncludes(src string) (libs []string, rest string) {
	for {
		line, after, _ := strings.Cut(src, "\n")
		names, ok := strings.CutPrefix(line, includeLine)
		if !ok {
			return libs, src
		}
		libs = append(libs, strings.Fields(names)...)
		src = after
	}
}
