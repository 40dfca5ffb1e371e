package etcdstore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// TestTLSConfigErrors checks that every problem with the TLS files is
// reported at once, without contacting anything.
func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.pem")
	if err := os.WriteFile(huge, make([]byte, conffile.MaxPEMBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	fifo := filepath.Join(dir, "ca.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  ClientConfig
		errs []string
	}{
		{name: "cert-without-key", cfg: ClientConfig{CertFile: garbage}, errs: []string{"without --etcd-key-file"}},
		{name: "key-without-cert", cfg: ClientConfig{KeyFile: garbage}, errs: []string{"without --etcd-cert-file"}},
		{name: "ca-not-pem", cfg: ClientConfig{CAFile: garbage}, errs: []string{"no PEM certificate"}},
		{name: "ca-too-big", cfg: ClientConfig{CAFile: huge}, errs: []string{"more than 1 MiB"}},
		{name: "ca-a-fifo", cfg: ClientConfig{CAFile: fifo}, errs: []string{"is a FIFO"}},
		{name: "cert-a-device", cfg: ClientConfig{CertFile: "/dev/zero", KeyFile: garbage}, errs: []string{"/dev/zero is a character device"}},
		{name: "all-wrong", cfg: ClientConfig{CAFile: missing, CertFile: missing, KeyFile: garbage}, errs: []string{"etcd CA file", "etcd certificate file", "missing.pem"}},
		{name: "bad-pair", cfg: ClientConfig{CertFile: garbage, KeyFile: garbage}, errs: []string{"etcd client certificate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cfg.TLSConfig()
			if err == nil {
				t.Fatal("TLSConfig succeeded")
			}
			for _, want := range tt.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	if cfg, err := (ClientConfig{}).TLSConfig(); cfg != nil || err != nil {
		t.Errorf("no files: TLSConfig() = %v, %v; want plain TCP", cfg, err)
	}
}

// TestTLS connects to a cluster that serves TLS with client-certificate
// auth: the right CA and client certificate work end to end, and every
// wrong combination fails in NewClient with the reason.
func TestTLS(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{TLS: true})
	certs := c.Certs
	eps := c.Endpoints()
	tests := []struct {
		name string
		cfg  ClientConfig
		err  string // empty: must work
	}{
		{name: "ca-and-client-cert", cfg: ClientConfig{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}},
		{name: "wrong-ca", cfg: ClientConfig{CAFile: certs.OtherCA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, err: "certificate signed by unknown authority"},
		{name: "system-roots", cfg: ClientConfig{CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, err: "certificate signed by unknown authority"},
		{name: "no-client-cert", cfg: ClientConfig{CAFile: certs.CA}, err: "refused this client's certificate"},
		{name: "client-cert-of-other-ca", cfg: ClientConfig{CAFile: certs.CA, CertFile: certs.OtherClientCert, KeyFile: certs.OtherClientKey}, err: "refused this client's certificate"},
		{name: "plain-tcp", cfg: ClientConfig{}, err: "no member answered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Endpoints = eps
			cfg.DialTimeout = 1500 * time.Millisecond
			cl, err := NewClient(context.Background(), cfg)
			if tt.err != "" {
				if err == nil {
					cl.Close()
					t.Fatal("NewClient succeeded")
				}
				if !strings.Contains(err.Error(), tt.err) {
					t.Errorf("NewClient error %q does not mention %q", err, tt.err)
				}
				t.Logf("%v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			prefix := testPrefix("tls-" + tt.name)
			term := lead(t, newElector(t, cl, prefix, "a", 0))
			s := openStore(t, cl, prefix, term, Options{})
			if _, err := s.Load(ctxFor(t)); err != nil {
				t.Fatal(err)
			}
			if err := commit(t, s, Op{Key: "k", Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestServerAuthTLS connects with only a CA file to a cluster that does
// not ask for client certificates.
func TestServerAuthTLS(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, TLS: true, NoClientCertAuth: true})
	cl, err := NewClient(context.Background(), ClientConfig{Endpoints: c.Endpoints(), CAFile: c.Certs.CA})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	prefix := testPrefix("server-auth")
	term := lead(t, newElector(t, cl, prefix, "a", 0))
	s := openStore(t, cl, prefix, term, Options{})
	if _, err := s.Load(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := commit(t, s, Op{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(context.Background(), ClientConfig{Endpoints: c.Endpoints(), CAFile: c.Certs.OtherCA, DialTimeout: time.Second}); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("wrong CA: %v, want an unknown-authority error", err)
	}
}
