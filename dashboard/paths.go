package dashboard

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// Paths: how an address names a topic or a job, how a request's path is
// read, and where an action sends the browser back to.
//
// A topic or a job ID is one segment. An ordinary one is itself,
// percent-encoded, so that links read well. One that a browser, a proxy or
// a router could split or clean away ("." and "..", one holding '/', '\'
// or '%') is written as '!' and its base64url, which no cleaning changes;
// so is one that begins with '!', to tell them apart.

// coded begins a segment that holds a name in base64url (RFC 4648, no
// padding).
const coded = "!"

// segment is the path segment of a topic or an ID.
func segment(name string) string {
	if name == "." || name == ".." || strings.HasPrefix(name, coded) || strings.ContainsAny(name, `/\%`) {
		return coded + base64.RawURLEncoding.EncodeToString([]byte(name))
	}
	return url.PathEscape(name)
}

// unsegment reads a topic or an ID from its unescaped path segment.
func unsegment(seg string) (string, bool) {
	b64, ok := strings.CutPrefix(seg, coded)
	if !ok {
		return seg, seg != ""
	}
	b, err := base64.RawURLEncoding.DecodeString(b64)
	return string(b), err == nil && len(b) > 0
}

// segments splits an escaped path into its unescaped segments, ignoring
// the slashes around it.
func segments(escaped string) ([]string, bool) {
	escaped = strings.Trim(escaped, "/")
	if escaped == "" {
		return nil, true
	}
	parts := strings.Split(escaped, "/")
	for i, p := range parts {
		s, err := url.PathUnescape(p)
		if err != nil || s == "" {
			return nil, false
		}
		parts[i] = s
	}
	return parts, true
}

// prefixOf finds the prefix a request was mounted under: what
// http.StripPrefix took from the front of its path. It is "" at the root,
// or when that cannot be told.
func prefixOf(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return ""
	}
	full, rest := u.EscapedPath(), r.URL.EscapedPath()
	prefix, ok := strings.CutSuffix(full, rest)
	if !ok && rest == "/" {
		prefix, ok = full, true // "/admin/queue" stripped to "", then "/"
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if !ok || (prefix != "" && prefix[0] != '/') || strings.HasPrefix(prefix, "//") {
		return ""
	}
	return prefix
}

// backTo is where an action sends the browser back to: the address its
// form gave, when that is a page below prefix, else the overview.
func backTo(prefix, to string) string {
	path, _, _ := strings.Cut(to, "?")
	if !strings.HasPrefix(path, prefix+"/") || strings.Contains(path, "//") {
		return prefix + "/"
	}
	for i := 0; i < len(to); i++ {
		if to[i] <= ' ' || to[i] >= 0x7f || to[i] == '\\' || to[i] == '#' {
			return prefix + "/"
		}
	}
	for _, seg := range strings.Split(path, "/") {
		if s, err := url.PathUnescape(seg); err != nil || s == "." || s == ".." {
			return prefix + "/"
		}
	}
	return to
}
