package config

import (
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// parseWithin runs Parse and fails the test if it has not returned after
// 30 seconds (it blocks on a file: the defect this guards against).
func parseWithin(t *testing.T, args []string) (*Config, error) {
	t.Helper()
	type result struct {
		c   *Config
		err error
	}
	done := make(chan result, 1)
	go func() { c, err := parse(args, io.Discard); done <- result{c, err} }()
	select {
	case r := <-done:
		return r.c, r.err
	case <-time.After(30 * time.Second):
		t.Fatalf("parse(%q) has not returned after 30s: it blocks on a file", args)
		return nil, nil
	}
}

// TestConfigFilesMustBeRegular names a FIFO or a device in every flag
// that names a file: each is refused at once, all in one report, instead
// of hanging start-up (a FIFO) or reading until memory runs out
// (/dev/zero).
func TestConfigFilesMustBeRegular(t *testing.T) {
	f := newFiles(t)
	fifo := filepath.Join(f.dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"libvirt files", []string{"--use-fake-backend", "--offerings", fifo, "--base-user-data", "/dev/zero",
			"--tls-cert", fifo, "--tls-key", f.serverKey, "--tls-ca", "/dev/zero"}, []string{
			"--base-user-data: cannot read the cloud-init file: /dev/zero is a character device, not a regular file: name a regular file",
			"--tls-cert: cannot load the keypair $DIR/fifo / $DIR/server-key.pem: $DIR/fifo is a FIFO (named pipe), not a regular file: name a regular file",
			"--tls-ca: cannot read the CA bundle: /dev/zero is a character device, not a regular file: name a regular file",
			"--offerings: read offerings: $DIR/fifo is a FIFO (named pipe), not a regular file: name a regular file",
		}},
		{"catalog", []string{"--use-fake-backend", "--instance-types", "/dev/zero"}, []string{
			"--instance-types: read instance types: /dev/zero is a character device, not a regular file: name a regular file",
		}},
		{"proxmox files", []string{"--hypervisor", "proxmox", "--use-fake-backend", "--proxmox-token-file", fifo, "--proxmox-ca-file", "/dev/zero"}, []string{
			"--proxmox-token-file: cannot read the token secret: $DIR/fifo is a FIFO (named pipe), not a regular file: name a regular file",
			"--proxmox-ca-file: cannot read the CA bundle: /dev/zero is a character device, not a regular file: name a regular file",
		}},
		{"etcd files", []string{"--use-fake-backend", "--state", "etcd://127.0.0.1:2379/bf", "--etcd-ca-file", fifo,
			"--etcd-cert-file", "/dev/zero", "--etcd-key-file", f.serverKey}, []string{
			"--etcd-ca-file: etcd CA file: $DIR/fifo is a FIFO (named pipe), not a regular file: name a regular file",
			"--etcd-cert-file: etcd certificate file: /dev/zero is a character device, not a regular file: name a regular file",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWithin(t, tt.args)
			got := lines(err)
			for i := range got {
				got[i] = strings.ReplaceAll(got[i], f.dir, "$DIR")
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConfigFileProblemsTogether checks a catalog's and the pricing's
// bounds are reported with the other problems, each once.
func TestConfigFileProblemsTogether(t *testing.T) {
	f := newFiles(t)
	types := writeFile(t, filepath.Join(f.dir, "types.json"), []byte("{\n  \"kvm.huge\": {\"vcpu\": 4096, \"memory_mib\": 1024},\n  \"kvm.huge\": {\"vcpu\": 1, \"memory_mib\": 1}\n}"))
	_, err := parseWithin(t, []string{"--use-fake-backend", "--instance-types", types, "--price-per-vcpu-hour", "1e9", "--seed-count", "0"})
	want := []string{
		"--instance-types: $DIR/types.json: line 3: key \"kvm.huge\" is given twice in one object (first on line 2); keep one",
		"--instance-types: $DIR/types.json: instance type \"kvm.huge\": vcpu 4096 is above the cap of 1024",
		"--price-per-vcpu-hour: must be a finite number from 0 to 1000000, got 1e+09 (0 makes that dimension free)",
		"--seed-count: must be between 1 and 1000000, got 0 (each slot costs memory and state; split a larger host-set across providers)",
	}
	got := lines(err)
	for i := range got {
		got[i] = strings.ReplaceAll(got[i], f.dir, "$DIR")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}
