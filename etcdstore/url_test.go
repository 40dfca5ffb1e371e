package etcdstore

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		in        string
		endpoints []string
		prefix    string
		err       string // substring of the error; empty for success
	}{
		{in: "etcd://127.0.0.1:2379/bigfleet", endpoints: []string{"127.0.0.1:2379"}, prefix: "/bigfleet"},
		{in: "etcd://e1:2379,e2.example.com:2380,[::1]:2381/bf/prod/", endpoints: []string{"e1:2379", "e2.example.com:2380", "[::1]:2381"}, prefix: "/bf/prod"},
		{in: "etcd://localhost:1/a-b_c.d", endpoints: []string{"localhost:1"}, prefix: "/a-b_c.d"},
		{in: "/var/lib/provider/state", err: "must start with etcd://"},
		{in: "http://e1:2379/p", err: "must start with etcd://"},
		{in: "etcd:///p", err: "no endpoints"},
		{in: "etcd://", err: "no endpoints"},
		{in: "etcd://e1:2379", err: "no key prefix"},
		{in: "etcd://e1:2379/", err: "empty key prefix"},
		{in: "etcd://e1:2379//", err: "empty key prefix"},
		{in: "etcd://e1:2379/a//b", err: "empty segment"},
		{in: "etcd://e1:2379/a/../b", err: `".." segment`},
		{in: "etcd://e1:2379/a/./b", err: `"." segment`},
		{in: "etcd://e1:2379/a b", err: "space or control character"},
		{in: "etcd://e1:2379/a\x01", err: "space or control character"},
		{in: "etcd://e1:2379/p?x=1", err: "query strings"},
		{in: "etcd://e1:2379/p#frag", err: "query strings"},
		{in: "etcd://user:pw@e1:2379/p", err: "credentials"},
		{in: "etcd://e1/p", err: "not HOST:PORT"},
		{in: "etcd://e1:/p", err: "port must be"},
		{in: "etcd://e1:0/p", err: "port must be"},
		{in: "etcd://e1:65536/p", err: "port must be"},
		{in: "etcd://e1:02379/p", err: "port must be"},
		{in: "etcd://e1:http/p", err: "port must be"},
		{in: "etcd://:2379/p", err: "has no host"},
		{in: "etcd://e1:2379,/p", err: "endpoint 2: empty endpoint"},
		{in: "etcd://e1:2379,e1:2379/p", err: "listed twice"},
		{in: "etcd://bad_host:2379/p", err: "neither an IP address nor a host name"},
		{in: "etcd://-bad:2379/p", err: "neither an IP address nor a host name"},
		{in: "etcd://e1:2379/" + strings.Repeat("x", MaxPrefixBytes), err: "more than the 256 allowed"},
		{in: "etcd://" + strings.Repeat("e:1,", MaxEndpoints) + "e:2/p", err: "more than the 16 allowed"},
		{in: "etcd://e1:2379/" + strings.Repeat("x", MaxURLBytes), err: "bytes, more than the 4096 allowed"},
	}
	for _, tt := range tests {
		t.Run(quote(tt.in), func(t *testing.T) {
			eps, prefix, err := ParseURL(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseURL(%q) error = %v, want one containing %q", tt.in, err, tt.err)
				}
				if len(err.Error()) > 400 {
					t.Errorf("error is %d bytes; input must not be echoed unbounded", len(err.Error()))
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseURL(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.endpoints, eps); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			if prefix != tt.prefix {
				t.Errorf("prefix = %q, want %q", prefix, tt.prefix)
			}
		})
	}
}

func TestIsURL(t *testing.T) {
	for in, want := range map[string]bool{
		"etcd://e:1/p":    true,
		"/var/lib/state":  false,
		"state":           false,
		"etcd:/e:1/p":     false,
		"ETCD://e:1/p":    false,
		"./etcd://e:1/p":  false,
		"etcd-state/file": false,
	} {
		if got := IsURL(in); got != want {
			t.Errorf("IsURL(%q) = %v, want %v", in, got, want)
		}
	}
}
