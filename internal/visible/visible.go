// Package visible shows names as they are: what a screen shows as it is
// stays as it is, and what it would hide or reorder (control and format
// characters such as a right-to-left override, invalid UTF-8) is written
// as a Go escape.
package visible

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Escape returns s with every rune that is not printable as its Go
// escape (\n, \u202e, \x00), and every invalid byte as \xff. Backslashes
// stay as they are, so that a name shown can be given back as it was,
// unless it held such runes.
func Escape(s string) string {
	i := 0
	for i < len(s) && shown(s[i:]) {
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case shown(s[i:]):
			b.WriteString(s[i : i+n])
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// shown reports whether the rune s starts with is valid and printable.
func shown(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return unicode.IsPrint(r) && !(r == utf8.RuneError && n == 1)
}
