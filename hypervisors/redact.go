package hypervisors

import (
	"net/url"
	"strings"
)

// RedactURL returns s, a URI or URL, fit for a message: a password in its
// user info is replaced by "xxxxx" (as url.URL.Redacted does). It never
// returns the password, even when s does not parse: then the user info
// of "scheme://user:pass@host..." is redacted by hand, and a string whose
// user info cannot be told apart is shown as "<unparsable URL>" (an
// opaque "scheme:user:pass@host" as "scheme:<redacted>").
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		if strings.Contains(u.Opaque, "@") { // "scheme:user:pass@host": no user info to redact
			return u.Scheme + ":<redacted>"
		}
		return u.Redacted()
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		if strings.ContainsAny(s, "@") {
			return "<unparsable URL>"
		}
		return s
	}
	authority, path := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		if strings.Contains(path, "@") {
			return scheme + "://" + authority + "/<unparsable URL>"
		}
		return s
	}
	user, _, hasPass := strings.Cut(authority[:at], ":")
	if !hasPass {
		return s
	}
	return scheme + "://" + user + ":xxxxx" + authority[at:] + path
}
