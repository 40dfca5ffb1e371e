package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// checkCABundle reads a PEM file and requires at least one certificate.
func checkCABundle(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("cannot read the CA bundle: %v", err)
	}
	n := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("%s holds a certificate that does not parse: %v", file, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s holds no PEM certificate; point it at a PEM CA bundle", file)
	}
	return nil
}

// resolveTLS checks the gRPC listener's TLS flags and files.
func resolveTLS(t *TLS, cert, key, ca string, p *problems) {
	switch {
	case cert != "" && key == "":
		p.add("tls-cert", "is set without --tls-key; pass both to enable TLS, or neither")
	case cert == "" && key != "":
		p.add("tls-key", "is set without --tls-cert; pass both to enable TLS, or neither")
	case cert == "" && ca != "":
		p.add("tls-ca", "enables mTLS, which needs a server certificate: also pass --tls-cert and --tls-key")
	case cert != "":
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			p.add("tls-cert", "cannot load the keypair %s / %s: %v", cert, key, keypairReason(err))
		}
		if ca != "" {
			if err := checkCABundle(ca); err != nil {
				p.add("tls-ca", "%v", err)
			}
		}
	}
	*t = TLS{Cert: cert, Key: key, CA: ca}
}

// keypairReason strips a *PathError's op so the message reads naturally.
func keypairReason(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %v", pe.Path, pe.Err)
	}
	return err
}
