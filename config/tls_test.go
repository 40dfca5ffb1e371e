package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// certSpec describes a test certificate relative to now.
type certSpec struct {
	cn        string
	from, to  time.Duration // NotBefore, NotAfter from now
	usages    []x509.ExtKeyUsage
	isCA      bool
	signer    *x509.Certificate
	signerKey *ecdsa.PrivateKey
}

// mkCert writes a PEM certificate (self-signed unless signer is set) and
// returns it with its key.
func mkCert(t *testing.T, s certSpec) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: s.cn},
		NotBefore: now.Add(s.from), NotAfter: now.Add(s.to), ExtKeyUsage: s.usages,
		IsCA: s.isCA, BasicConstraintsValid: true, DNSNames: []string{s.cn},
	}
	parent, parentKey := tmpl, key
	if s.signer != nil {
		parent, parentKey = s.signer, s.signerKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

const day = 24 * time.Hour

// TestCertificatesCheckedAtStart: a certificate the provider presents
// that has expired, is not valid yet or lacks the extended key usage its
// role needs refuses the start, every one in the same report; one close
// to its expiry starts with a warning and is listed for the expiry gauge.
func TestCertificatesCheckedAtStart(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data ...[]byte) string {
		return writeFile(t, filepath.Join(dir, name), []byte(strings.Join(func() []string {
			var s []string
			for _, d := range data {
				s = append(s, string(d))
			}
			return s
		}(), "")))
	}
	pair := func(name string, s certSpec) (cert, key string) {
		_, _, c, k := mkCert(t, s)
		return write(name+".pem", c), write(name+"-key.pem", k)
	}
	server := func(name string, s certSpec) []string {
		c, k := pair(name, s)
		return []string{"--use-fake-backend", "--tls-cert", c, "--tls-key", k}
	}
	year := 365 * day
	_, _, caPEM, _ := mkCert(t, certSpec{cn: "ca", from: -day, to: year, isCA: true})
	_, _, expiredCAPEM, _ := mkCert(t, certSpec{cn: "old-ca", from: -year, to: -day, isCA: true})
	// A leaf signed by a CA that has expired meanwhile: the chain file
	// holds the leaf and the expired intermediate.
	oldCA, oldCAKey, oldCAPEM, _ := mkCert(t, certSpec{cn: "old-intermediate", from: -year, to: -time.Hour, isCA: true})
	_, _, leafPEM, leafKey := mkCert(t, certSpec{cn: "leaf", from: -day, to: year, signer: oldCA, signerKey: oldCAKey})
	chain := write("chain.pem", leafPEM, oldCAPEM)
	chainKey := write("chain-key.pem", leafKey)

	pki := filepath.Join(dir, "libvirt-pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	_, _, lvCert, lvKey := mkCert(t, certSpec{cn: "libvirt-client", from: -year, to: -day, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	writeFile(t, filepath.Join(pki, "clientcert.pem"), lvCert)
	writeFile(t, filepath.Join(pki, "clientkey.pem"), lvKey)
	etcdCert, etcdKey := pair("etcd-client", certSpec{cn: "etcd-client", from: -day, to: year, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})

	tests := []struct {
		name     string
		args     []string
		problems []string // each a substring of one problem, in order
		warnings []string // each a substring of one warning, in order
		roles    []string // Config.Certs roles
	}{
		{name: "valid, no extended key usage", args: server("plain", certSpec{cn: "plain", from: -day, to: year}), roles: []string{CertServer}},
		{name: "valid, serverAuth", args: server("ok", certSpec{cn: "ok", from: -day, to: year, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}), roles: []string{CertServer}},
		{name: "close to expiry", args: server("soon", certSpec{cn: "soon", from: -day, to: 2 * day}),
			warnings: []string{`the server certificate ` + dir + `/soon.pem (CN=soon) expires in 4`}, roles: []string{CertServer}},
		{name: "expired", args: server("expired", certSpec{cn: "expired", from: -year, to: -time.Hour}),
			problems: []string{"--tls-cert: " + dir + "/expired.pem (CN=expired): the certificate expired 1h0m0s ago, at "}},
		{name: "not yet valid", args: server("future", certSpec{cn: "future", from: day, to: year}),
			problems: []string{"--tls-cert: " + dir + "/future.pem (CN=future): the certificate is not valid before "}},
		{name: "client-only extended key usage", args: server("client", certSpec{cn: "client", from: -day, to: year, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}),
			problems: []string{"--tls-cert: " + dir + "/client.pem (CN=client): the certificate lists extended key usages without serverAuth, so peers refuse it as a server certificate; issue one with serverAuth"}},
		{name: "expired intermediate", args: []string{"--use-fake-backend", "--tls-cert", chain, "--tls-key", chainKey},
			problems: []string{`--tls-cert: ` + dir + `/chain.pem (CN=leaf): intermediate "CN=old-intermediate" in the chain expired 1h0m0s ago`}},
		{name: "client CA bundle: one CA expired, one valid",
			args:     append(server("ok2", certSpec{cn: "ok2", from: -day, to: year}), "--tls-ca", write("bundle.pem", expiredCAPEM, caPEM)),
			warnings: []string{`the CA bundle ` + dir + `/bundle.pem holds CA "CN=old-ca", which expired 24h0m0s ago`}, roles: []string{CertServer}},
		{name: "client CA bundle: every CA expired",
			args:     append(server("ok3", certSpec{cn: "ok3", from: -day, to: year}), "--tls-ca", write("old-bundle.pem", expiredCAPEM)),
			problems: []string{"--tls-ca: " + dir + `/old-bundle.pem holds no certificate that is valid now, so it can verify nothing: CA "CN=old-ca" expired 24h0m0s ago`},
			warnings: []string{`holds CA "CN=old-ca", which expired`}, roles: []string{CertServer}},
		{name: "everything at once: server, etcd and libvirt client",
			args: append(server("x", certSpec{cn: "x", from: -year, to: -day})[1:],
				"--state", "etcd://127.0.0.1:2379/bf", "--etcd-cert-file", etcdCert, "--etcd-key-file", etcdKey,
				"--connect", "rack1=qemu+tls://host1/system?pkipath="+pki, "--image", "base.qcow2"),
			problems: []string{
				"--etcd-cert-file: " + dir + "/etcd-client.pem (CN=etcd-client): the certificate lists extended key usages without clientAuth",
				"--tls-cert: " + dir + "/x.pem (CN=x): the certificate expired 24h0m0s ago",
				`--connect: zone "rack1": libvirt TLS client certificate ` + pki + "/clientcert.pem (CN=libvirt-client): the certificate expired 24h0m0s ago",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseWithin(t, tt.args)
			got := lines(err)
			if len(got) != len(tt.problems) {
				t.Fatalf("problems:\n%s\nwant %d", strings.Join(got, "\n"), len(tt.problems))
			}
			for i, want := range tt.problems {
				if !strings.HasPrefix(got[i], want) && !strings.Contains(got[i], want) {
					t.Errorf("problem %d:\n%s\ndoes not say\n%s", i, got[i], want)
				}
			}
			if err != nil {
				return
			}
			warnings := c.CertWarnings(time.Now())
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings:\n%s\nwant %d", strings.Join(warnings, "\n"), len(tt.warnings))
			}
			for i, want := range tt.warnings {
				if !strings.Contains(warnings[i], want) {
					t.Errorf("warning %d:\n%s\ndoes not say\n%s", i, warnings[i], want)
				}
			}
			var roles []string
			for _, ct := range c.Certs {
				roles = append(roles, ct.Role)
			}
			if diff := cmp.Diff(tt.roles, roles); diff != "" {
				t.Errorf("certificate roles (-want +got):\n%s", diff)
			}
		})
	}
}
