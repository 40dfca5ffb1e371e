package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs names PEM files generated for a TLS cluster.
type Certs struct {
	// CA signed the members' serving certificate and ClientCert.
	CA string
	// ServerCert and ServerKey are the members' serving pair (127.0.0.1,
	// ::1 and localhost).
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client pair the members accept.
	ClientCert, ClientKey string
	// OtherCA is an unrelated CA; OtherClientCert and OtherClientKey are a
	// client pair it signed, which the members reject.
	OtherCA                         string
	OtherClientCert, OtherClientKey string
}

// ClientTLS is the TLS configuration of a client that trusts CA and
// presents ClientCert.
func (c *Certs) ClientTLS() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(c.ClientCert, c.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("load test client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(c.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}, nil
}

type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func writeCerts(tb testing.TB, dir string) *Certs {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	c := &Certs{
		CA:              filepath.Join(dir, "ca.pem"),
		ServerCert:      filepath.Join(dir, "server.pem"),
		ServerKey:       filepath.Join(dir, "server-key.pem"),
		ClientCert:      filepath.Join(dir, "client.pem"),
		ClientKey:       filepath.Join(dir, "client-key.pem"),
		OtherCA:         filepath.Join(dir, "other-ca.pem"),
		OtherClientCert: filepath.Join(dir, "other-client.pem"),
		OtherClientKey:  filepath.Join(dir, "other-client-key.pem"),
	}
	ca := newCA(tb, "etcdtest CA", c.CA)
	other := newCA(tb, "etcdtest other CA", c.OtherCA)
	ca.issue(tb, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd member"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:    []string{"localhost"},
	}, c.ServerCert, c.ServerKey)
	ca.issue(tb, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "provider"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, c.ClientCert, c.ClientKey)
	other.issue(tb, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "intruder"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, c.OtherClientCert, c.OtherClientKey)
	return c
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func serial(tb testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func newCA(tb testing.TB, name, certPath string) *authority {
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, certPath, "CERTIFICATE", der)
	return &authority{cert: cert, key: key}
}

func (a *authority) issue(tb testing.TB, tmpl *x509.Certificate, certPath, keyPath string) {
	key := newKey(tb)
	tmpl.SerialNumber = serial(tb)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, certPath, "CERTIFICATE", der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, keyPath, "EC PRIVATE KEY", keyDER)
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}
