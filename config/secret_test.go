package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
)

func TestSecretNeverInErrors(t *testing.T) {
	f := newFiles(t)
	const inline = "INLINE-SECRET-1234"
	cases := [][]string{
		// Every Proxmox check failing at once, with the secret inline.
		{"--proxmox-api-url", "http://pve/api2/json", "--proxmox-token-id", "a@pve!b=" + inline, "--proxmox-token-secret", inline,
			"--proxmox-tls-fingerprint", "zz", "--nodes", "a/b", "--template-vmid", "1", "--offerings", f.noDir},
		// The secret pasted into the token id, with no secret flag.
		{"--proxmox-api-url", "https://pve/api2/json", "--proxmox-token-id", "PVEAPIToken=a@pve!b=" + inline, "--nodes", "pve1"},
		// The secret from a file, with unrelated failures.
		{"--proxmox-api-url", "https://pve/api2/json", "--proxmox-token-id", "bad", "--proxmox-token-file", f.token, "--nodes", "pve1", "--prices", "x=1"},
	}
	for _, args := range cases {
		_, err := parse(args, io.Discard)
		if err == nil {
			t.Fatalf("parse(%q) succeeded, want errors", args)
		}
		for _, s := range []string{inline, tokenSecret} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("error for %q contains the token secret:\n%v", args, err)
			}
		}
	}
}

func TestSecretNeverPrinted(t *testing.T) {
	f := newFiles(t)
	c, err := parse(f.expand(proxmoxSeedArgs, f.pxOfferings), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Plugin.(*proxmox.Settings).TokenSecret.Reveal(); got != tokenSecret {
		t.Fatalf("Reveal() = %q, want the trimmed file content %q", got, tokenSecret)
	}
	var out []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		out = append(out,
			fmt.Sprintf(verb, c), fmt.Sprintf(verb, *c), fmt.Sprintf(verb, *c.Plugin.(*proxmox.Settings)),
			fmt.Sprintf(verb, c.Plugin.(*proxmox.Settings).TokenSecret), fmt.Sprintf(verb, c.Plugin))
	}
	out = append(out, c.String(), c.Plugin.(*proxmox.Settings).TokenSecret.String(), c.Plugin.(*proxmox.Settings).TokenSecret.GoString())
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, string(js))
	for _, h := range []func(io.Writer) slog.Handler{
		func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) },
		func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) },
	} {
		var buf bytes.Buffer
		slog.New(h(&buf)).Info("config", "config", c, "proxmox", c.Plugin, "secret", c.Plugin.(*proxmox.Settings).TokenSecret)
		out = append(out, buf.String())
	}
	for _, s := range out {
		if strings.Contains(s, tokenSecret) {
			t.Errorf("output contains the token secret:\n%s", s)
		}
	}
	if !strings.Contains(c.String(), "token_secret=[redacted]") {
		t.Errorf("String() = %q, want it to show the secret as [redacted]", c.String())
	}
}
