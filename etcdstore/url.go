package etcdstore

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Scheme is the URL scheme that selects an etcd state.
const Scheme = "etcd://"

// Caps on what ParseURL accepts.
const (
	MaxURLBytes    = 4096
	MaxEndpoints   = 16
	MaxPrefixBytes = 256
)

// IsURL reports whether s names an etcd state rather than a local path.
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// ParseURL splits etcd://HOST:PORT[,HOST:PORT...]/PREFIX into the member
// endpoints ("host:port", in the order given) and the key prefix. The
// prefix keeps a leading slash and loses any trailing one, so
// "etcd://e1:2379/bigfleet/prod/" has prefix "/bigfleet/prod"; every key
// the provider writes lives below PREFIX + "/".
//
// Rejected with an error naming the problem: another scheme, no endpoints,
// a host without a port or with a port outside 1-65535, an empty or
// duplicate endpoint, credentials (user@), a query string or fragment, an
// empty prefix, a prefix with empty, "." or ".." segments or with control
// characters, and anything longer than the caps above.
func ParseURL(s string) (endpoints []string, prefix string, err error) {
	if len(s) > MaxURLBytes {
		return nil, "", fmt.Errorf("etcd state URL is %d bytes, more than the %d allowed", len(s), MaxURLBytes)
	}
	if !IsURL(s) {
		return nil, "", fmt.Errorf("etcd state URL %s: must start with %s", quote(s), Scheme)
	}
	rest := s[len(Scheme):]
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return nil, "", fmt.Errorf("etcd state URL %s: query strings and fragments are not supported", quote(s))
	}
	authority, path, hasPath := strings.Cut(rest, "/")
	if strings.Contains(authority, "@") {
		return nil, "", fmt.Errorf("etcd state URL %s: credentials in the URL are not supported; use --etcd-cert-file and --etcd-key-file", quote(s))
	}
	if authority == "" {
		return nil, "", fmt.Errorf("etcd state URL %s: no endpoints (want etcd://HOST:PORT[,HOST:PORT...]/PREFIX)", quote(s))
	}
	parts := strings.Split(authority, ",")
	if len(parts) > MaxEndpoints {
		return nil, "", fmt.Errorf("etcd state URL %s: %d endpoints, more than the %d allowed", quote(s), len(parts), MaxEndpoints)
	}
	seen := make(map[string]bool, len(parts))
	for i, p := range parts {
		ep, err := parseEndpoint(p)
		if err != nil {
			return nil, "", fmt.Errorf("etcd state URL %s: endpoint %d: %w", quote(s), i+1, err)
		}
		if seen[ep] {
			return nil, "", fmt.Errorf("etcd state URL %s: endpoint %s is listed twice", quote(s), quote(ep))
		}
		seen[ep] = true
		endpoints = append(endpoints, ep)
	}
	if !hasPath {
		return nil, "", fmt.Errorf("etcd state URL %s: no key prefix (want etcd://HOST:PORT/PREFIX)", quote(s))
	}
	prefix, err = parsePrefix(path)
	if err != nil {
		return nil, "", fmt.Errorf("etcd state URL %s: %w", quote(s), err)
	}
	return endpoints, prefix, nil
}

func parseEndpoint(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty endpoint")
	}
	host, port, err := net.SplitHostPort(p)
	if err != nil {
		return "", fmt.Errorf("%s is not HOST:PORT", quote(p))
	}
	if host == "" {
		return "", fmt.Errorf("%s has no host", quote(p))
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return "", fmt.Errorf("%s: port must be a number from 1 to 65535", quote(p))
	}
	if ip := net.ParseIP(host); ip == nil && !validHostname(host) {
		return "", fmt.Errorf("%s: %s is neither an IP address nor a host name", quote(p), quote(host))
	}
	return net.JoinHostPort(host, port), nil
}

// validHostname accepts RFC 1123 host names: dot-separated labels of
// letters, digits and inner hyphens, each 1-63 bytes, 253 bytes in all.
func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func parsePrefix(path string) (string, error) {
	path = strings.TrimSuffix(path, "/")
	if path == "" {
		return "", fmt.Errorf("empty key prefix (want etcd://HOST:PORT/PREFIX)")
	}
	if len(path)+1 > MaxPrefixBytes {
		return "", fmt.Errorf("key prefix is %d bytes, more than the %d allowed", len(path)+1, MaxPrefixBytes)
	}
	if !utf8.ValidString(path) {
		return "", fmt.Errorf("key prefix is not valid UTF-8")
	}
	for _, seg := range strings.Split(path, "/") {
		switch seg {
		case "":
			return "", fmt.Errorf("key prefix %s has an empty segment", quote(path))
		case ".", "..":
			return "", fmt.Errorf("key prefix %s has a %q segment", quote(path), seg)
		}
		for _, c := range seg {
			if c < 0x20 || c == 0x7f || c == ' ' {
				return "", fmt.Errorf("key prefix %s contains a space or control character", quote(path))
			}
		}
	}
	return "/" + path, nil
}

// quote quotes s for an error message, cut to a bounded length.
func quote(s string) string {
	const max = 80
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	}
	return strconv.Quote(s)
}
