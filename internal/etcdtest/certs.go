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

func writeCerts(dir string) (*Certs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
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
	ca, err := newCA("etcdtest CA", c.CA)
	if err != nil {
		return nil, err
	}
	other, err := newCA("etcdtest other CA", c.OtherCA)
	if err != nil {
		return nil, err
	}
	if err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd member"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:    []string{"localhost"},
	}, c.ServerCert, c.ServerKey); err != nil {
		return nil, err
	}
	if err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "provider"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, c.ClientCert, c.ClientKey); err != nil {
		return nil, err
	}
	if err := other.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "intruder"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, c.OtherClientCert, c.OtherClientKey); err != nil {
		return nil, err
	}
	return c, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

func newCA(name, certPath string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key}, nil
}

func (a *authority) issue(tmpl *x509.Certificate, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if tmpl.SerialNumber, err = serial(); err != nil {
		return err
	}
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", keyDER)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
