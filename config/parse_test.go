package config

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
	"github.com/google/go-cmp/cmp"
)

func TestParseConnect(t *testing.T) {
	tests := []struct {
		in   string
		want []lvuri.ZoneURI
	}{
		{"", nil},
		{"qemu:///system", []lvuri.ZoneURI{{Zone: "local", URI: "qemu:///system"}}},
		{" qemu:///session ", []lvuri.ZoneURI{{Zone: "local", URI: "qemu:///session"}}},
		{"test:///default", []lvuri.ZoneURI{{Zone: "local", URI: "test:///default"}}},
		{"qemu+unix:///system?socket=/run/libvirt/libvirt-sock", []lvuri.ZoneURI{{Zone: "local", URI: "qemu+unix:///system?socket=/run/libvirt/libvirt-sock"}}},
		// A bare URI whose query holds '=' (the text before it has ':').
		{"qemu+libssh://u@h/system?keyfile=/k&known_hosts=/kh&known_hosts_verify=normal",
			[]lvuri.ZoneURI{{Zone: "local", URI: "qemu+libssh://u@h/system?keyfile=/k&known_hosts=/kh&known_hosts_verify=normal"}}},
		{"qemu+ssh://u@h:2222/system?keyfile=/k&no_verify=0", []lvuri.ZoneURI{{Zone: "local", URI: "qemu+ssh://u@h:2222/system?keyfile=/k&no_verify=0"}}},
		{"qemu+tls://h/system?pkipath=/pki&no_verify=0", []lvuri.ZoneURI{{Zone: "local", URI: "qemu+tls://h/system?pkipath=/pki&no_verify=0"}}},
		{"qemu://h/system", []lvuri.ZoneURI{{Zone: "local", URI: "qemu://h/system"}}},
		{"rack1=qemu+libssh2://h1/system, rack2 = qemu+tls://h2/system,", []lvuri.ZoneURI{{Zone: "rack1", URI: "qemu+libssh2://h1/system"}, {Zone: "rack2", URI: "qemu+tls://h2/system"}}},
		{seedConnect, []lvuri.ZoneURI{{Zone: "rack1", URI: rack1URI}, {Zone: "rack2", URI: rack2URI}}},
	}
	for _, tt := range tests {
		got, err := lvuri.ParseConnect(tt.in, "local")
		if err != nil {
			t.Errorf("ParseConnect(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseConnect(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestResolveWithSubcommandFlags(t *testing.T) {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := RegisterFlags(fs, testReg)
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	if err := fs.Parse([]string{"--use-fake-backend", "--json", "--log-format", "JSON", "--log-level", "debug"}); err != nil {
		t.Fatal(err)
	}
	c, err := f.Resolve(fs)
	if err != nil {
		t.Fatal(err)
	}
	if !*asJSON || c.LogFormat != "json" || c.LogLevel.String() != "DEBUG" {
		t.Errorf("json=%v format=%q level=%v; want true, json, DEBUG", *asJSON, c.LogFormat, c.LogLevel)
	}
	var buf bytes.Buffer
	f.Usage(&buf, fs)
	if !strings.Contains(buf.String(), "\nOther:\n  --json\n") {
		t.Errorf("Usage does not list the subcommand's flag under Other:\n%s", buf.String())
	}
}

func TestUsage(t *testing.T) {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	f := RegisterFlags(fs, testReg)
	var buf bytes.Buffer
	f.Usage(&buf, fs)
	text := buf.String()
	// Every flag is listed exactly once, and only in a group.
	fs.VisitAll(func(fl *flag.Flag) {
		if n := strings.Count(text, "  --"+fl.Name+" ") + strings.Count(text, "  --"+fl.Name+"\n"); n != 1 {
			t.Errorf("--%s listed %d times in Usage", fl.Name, n)
		}
	})
	if strings.Contains(text, "Other:") {
		t.Errorf("Usage has an Other group for the provider's own flags:\n%s", text)
	}
	var titles []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") {
			titles = append(titles, line)
		}
	}
	want := []string{"Core:", "High availability (--state etcd://...):", "libvirt connection and launch parameters:", "Proxmox connection and clone parameters:", "Instance types & pricing:", "Offerings:", "Lifecycle:", "History:", "Observability & TLS:", "Fake backend (testing only):"}
	if diff := cmp.Diff(want, titles); diff != "" {
		t.Errorf("groups (-want +got):\n%s", diff)
	}
	for _, s := range []string{"  --addr string\n", "(default :9000)", "(default 0.003)", "(default 2m0s)", "(default /bin/sh)"} {
		if !strings.Contains(text, s) {
			t.Errorf("Usage lacks %q:\n%s", s, text)
		}
	}
}

func TestParseHelp(t *testing.T) {
	var stderr bytes.Buffer
	_, err := parse([]string{"-h"}, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parse(-h) error = %v, want flag.ErrHelp", err)
	}
	if !strings.HasPrefix(stderr.String(), "Usage: provider [flags]\n\nCore:\n") {
		t.Errorf("help output starts %q", stderr.String()[:min(60, stderr.Len())])
	}
}

func TestStoragePoolPerZone(t *testing.T) {
	cfg, err := parse([]string{"--connect", "a=qemu:///system,b=qemu:///system", "--image", "x", "--storage-pool", "a=pool-a, b=pool-b"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"a": "pool-a", "b": "pool-b"}, cfg.Plugin.(*libvirt.Settings).ZonePools); diff != "" {
		t.Errorf("zone pools (-want +got):\n%s", diff)
	}
	if cfg.Plugin.(*libvirt.Settings).StoragePool != "default" {
		t.Errorf("pool for unnamed zones = %q", cfg.Plugin.(*libvirt.Settings).StoragePool)
	}
}

// One check decides what an etcd state is (etcdstore.IsURL, lower-case
// etcd://). ETCD:// used to pass the URL check here and then be opened as
// a local file named after the URL; now it is a clear error.
func TestStateEtcdSchemeOnlyLowerCase(t *testing.T) {
	c, err := parse([]string{"--use-fake-backend", "--state", "etcd://127.0.0.1:2379/bf"}, io.Discard)
	if err != nil || c.Etcd == nil || c.Etcd.Prefix != "/bf" {
		t.Fatalf("--state etcd://127.0.0.1:2379/bf: config %+v, err %v", c, err)
	}
	for _, state := range []string{"ETCD://127.0.0.1:2379/bf", "Etcd://127.0.0.1:2379/bf"} {
		c, err := parse([]string{"--use-fake-backend", "--state", state}, io.Discard)
		if err == nil {
			t.Errorf("--state %s: accepted (etcd %v, state path %q)", state, c.Etcd, c.StatePath)
			continue
		}
		if want := "write the scheme in lower case, etcd://"; !strings.Contains(err.Error(), want) {
			t.Errorf("--state %s: error %q does not say %q", state, err, want)
		}
	}
}
