package proxmox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
)

// listened returns the lines that show the provider got as far as
// listening.
func listened(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "serving CapacityProvider") || strings.Contains(l, "metrics listening") {
			lines = append(lines, l)
		}
	}
	return lines
}

// replace returns argv with the value of flag replaced.
func replace(argv []string, flag, value string) []string {
	out := append([]string(nil), argv...)
	for i := range out {
		if out[i] == flag && i+1 < len(out) {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// TestStartupRefusals: the binary refuses to start, before listening and
// with a non-zero exit, when the API would be reached insecurely or the
// cluster cannot serve the configuration; it names every problem at once.
func TestStartupRefusals(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	base := c.flags(t, launch{trust: pinFingerprint})
	for _, tc := range []struct {
		name     string
		argv     []string
		revoke   string // privilege revoked on "/" before the start
		wantCode int
		want     []string
		noCalls  bool // the simulator must see no API request at all
	}{{
		name:     "http-url",
		argv:     replace(base, "--proxmox-api-url", strings.Replace(c.url, "https://", "http://", 1)),
		wantCode: 2,
		want:     []string{"proxmox-api-url", "http://", "clear text"},
		noCalls:  true,
	}, {
		name:     "wrong-fingerprint",
		argv:     replace(base, "--proxmox-tls-fingerprint", strings.Repeat("ab", 32)),
		wantCode: 1,
		want:     []string{"preflight", "certificate fingerprint mismatch"},
		noCalls:  true, // the TLS handshake fails before any request
	}, {
		name:     "ca-file-of-another-server",
		argv:     replace(replace(base, "--proxmox-tls-fingerprint", ""), "--proxmox-ca-file", otherCA(t)),
		wantCode: 1,
		want:     []string{"preflight", "certificate"},
		noCalls:  true,
	}, {
		name: "missing-privilege-template-and-node",
		argv: replace(replace(base, "--template-vmid", "9100"), "--nodes", "pve1,pve2,pve7"),
		// The offerings stay on pve1/pve2, which exist.
		revoke:   "VM.PowerMgmt",
		wantCode: 1,
		want: []string{
			"3 errors occurred",
			`pve7\" does not exist in the cluster`, // the text log quotes the error
			"template vm 9100 does not exist",
			"lacks privilege VM.PowerMgmt on /pool/" + poolName,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.revoke != "" {
				c.sim.Revoke(tokenID, "/", tc.revoke)
				t.Cleanup(func() { c.sim.AddToken(tokenWithFullAccess(c)) })
			}
			before := c.sim.RequestCount("")
			out, code := runExit(t, tc.argv)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d", code, tc.wantCode)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not say %q", w)
				}
			}
			if l := listened(out); len(l) > 0 {
				t.Errorf("the provider listened before refusing:\n%s", strings.Join(l, "\n"))
			}
			if n := c.sim.RequestCount("") - before; tc.noCalls && n != 0 {
				t.Errorf("the simulator served %d requests, want none", n)
			}
			if strings.Contains(out, c.secret) {
				t.Errorf("the token secret appears in the output")
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// otherCA writes the certificate of an unrelated server as a CA bundle.
func otherCA(t *testing.T) string {
	t.Helper()
	_, pemBytes, _, err := pvesim.SelfSignedPEM([]string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(p, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func tokenWithFullAccess(c *cluster) pvesim.Token {
	return pvesim.Token{ID: tokenID, Secret: c.secret, ACL: pvesim.FullAccess()}
}
