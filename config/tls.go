package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/plugin"
)

// CertExpiryWarning is how close to its expiry a certificate the
// provider presents or trusts makes start-up log a warning
// (docs/security.md). An expired one, or one not yet valid, refuses the
// start.
const CertExpiryWarning = 14 * 24 * time.Hour

// Roles of the certificates checked at start (the role label of the
// bigfleet_provider_certificate_expiry_seconds gauge).
const (
	// CertServer is --tls-cert: the gRPC server's certificate, which the
	// metrics listener also serves with --metrics-tls.
	CertServer = "server"
	// CertEtcdClient is --etcd-cert-file.
	CertEtcdClient = "etcd-client"
	// A hypervisor's client certificates have its own roles
	// (plugin.CertFile.Role, e.g. libvirt-client).
)

// Cert is a certificate chain the provider presents, as checked at
// start. NotAfter is the earliest expiry in the chain (leaf and
// intermediates): the chain stops working then.
type Cert struct {
	Role, File string
	Subject    string
	NotAfter   time.Time
}

// CertWarnings are the warnings start-up logs about certificates: every
// chain the provider presents and every CA it trusts that expires within
// CertExpiryWarning of now (an expired CA in a bundle that still holds a
// valid one included).
func (c *Config) CertWarnings(now time.Time) []string {
	var out []string
	for _, ct := range c.Certs {
		if left := ct.NotAfter.Sub(now); left < CertExpiryWarning {
			out = append(out, fmt.Sprintf("the %s certificate %s (%s) expires in %s, at %s; renew it and restart the provider",
				ct.Role, ct.File, ct.Subject, left.Round(time.Minute), ct.NotAfter.UTC().Format(time.RFC3339)))
		}
	}
	return append(out, c.CAWarnings...)
}

// checkCABundle reads a PEM CA bundle and requires at least one
// certificate in it that is valid now; it returns a warning for each one
// that has expired or expires within CertExpiryWarning.
func checkCABundle(file string, now time.Time) (warnings []string, err error) {
	data, err := conffile.Read(file, conffile.MaxPEMBytes)
	if err != nil {
		return nil, fmt.Errorf("cannot read the CA bundle: %v", err)
	}
	n, valid := 0, 0
	var problems []string
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s holds a certificate that does not parse: %v", file, err)
		}
		n++
		if why := validity(cert, now); why != "" {
			problems = append(problems, fmt.Sprintf("CA %s %s", subject(cert), why))
			warnings = append(warnings, fmt.Sprintf("the CA bundle %s holds CA %s, which %s", file, subject(cert), why))
			continue
		}
		valid++
		if left := cert.NotAfter.Sub(now); left < CertExpiryWarning {
			warnings = append(warnings, fmt.Sprintf("the CA bundle %s holds CA %s, which expires in %s, at %s", file, subject(cert), left.Round(time.Minute), cert.NotAfter.UTC().Format(time.RFC3339)))
		}
	}
	switch {
	case n == 0:
		return nil, fmt.Errorf("%s holds no PEM certificate; point it at a PEM CA bundle", file)
	case valid == 0:
		return nil, fmt.Errorf("%s holds no certificate that is valid now, so it can verify nothing: %s", file, strings.Join(problems, "; "))
	}
	return warnings, nil
}

// validity says why cert is not valid at now ("" if it is).
func validity(cert *x509.Certificate, now time.Time) string {
	switch {
	case now.After(cert.NotAfter):
		return fmt.Sprintf("expired %s ago, at %s", now.Sub(cert.NotAfter).Round(time.Minute), cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fmt.Sprintf("is not valid before %s (in %s; is the clock right?)", cert.NotBefore.UTC().Format(time.RFC3339), cert.NotBefore.Sub(now).Round(time.Minute))
	}
	return ""
}

func subject(cert *x509.Certificate) string {
	if s := cert.Subject.String(); s != "" {
		return fmt.Sprintf("%q", s)
	}
	return "(empty subject)"
}

// loadKeypair reads a certificate chain and its key, both regular PEM
// files of at most conffile.MaxPEMBytes.
func loadKeypair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := conffile.Read(certFile, conffile.MaxPEMBytes)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := conffile.Read(keyFile, conffile.MaxPEMBytes)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// checkChain checks a loaded chain the provider presents in role: every
// certificate in it valid at now, and the leaf allowed usage by its
// extended key usages when it lists any (a server certificate needs
// serverAuth, a client certificate clientAuth).
func checkChain(role, file string, pair tls.Certificate, usage x509.ExtKeyUsage, now time.Time) (Cert, error) {
	ct := Cert{Role: role, File: file}
	if len(pair.Certificate) == 0 {
		return ct, fmt.Errorf("%s holds no certificate", file)
	}
	var errs []string
	for i, der := range pair.Certificate {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return ct, fmt.Errorf("%s: certificate %d does not parse: %v", file, i, err)
		}
		what := "the certificate"
		if i > 0 {
			what = fmt.Sprintf("intermediate %s in the chain", subject(cert))
		} else {
			ct.Subject = cert.Subject.String()
			ct.NotAfter = cert.NotAfter
			if len(cert.ExtKeyUsage) > 0 && !slices.Contains(cert.ExtKeyUsage, usage) && !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny) {
				errs = append(errs, fmt.Sprintf("the certificate lists extended key usages without %s, so peers refuse it as a %s certificate; issue one with %s",
					usageName(usage), map[x509.ExtKeyUsage]string{x509.ExtKeyUsageServerAuth: "server", x509.ExtKeyUsageClientAuth: "client"}[usage], usageName(usage)))
			}
		}
		if cert.NotAfter.Before(ct.NotAfter) {
			ct.NotAfter = cert.NotAfter
		}
		if why := validity(cert, now); why != "" {
			errs = append(errs, what+" "+why)
		}
	}
	if len(errs) > 0 {
		return ct, fmt.Errorf("%s (%s): %s", file, ct.Subject, strings.Join(errs, "; "))
	}
	return ct, nil
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageClientAuth {
		return "clientAuth"
	}
	return "serverAuth"
}

// resolveTLS checks the gRPC listener's TLS flags and files.
func resolveTLS(c *Config, cert, key, ca string, now time.Time, p *problems) {
	c.TLS = TLS{Cert: cert, Key: key, CA: ca}
	switch {
	case cert != "" && key == "":
		p.add("tls-cert", "is set without --tls-key; pass both to enable TLS, or neither")
	case cert == "" && key != "":
		p.add("tls-key", "is set without --tls-cert; pass both to enable TLS, or neither")
	case cert == "" && ca != "":
		p.add("tls-ca", "enables mTLS, which needs a server certificate: also pass --tls-cert and --tls-key")
	case cert != "":
		if pair, err := loadKeypair(cert, key); err != nil {
			p.add("tls-cert", "cannot load the keypair %s / %s: %v", cert, key, keypairReason(err))
		} else if ct, err := checkChain(CertServer, cert, pair, x509.ExtKeyUsageServerAuth, now); err != nil {
			p.add("tls-cert", "%v", err)
		} else {
			c.Certs = append(c.Certs, ct)
		}
		if ca != "" {
			warnings, err := checkCABundle(ca, now)
			if err != nil {
				p.add("tls-ca", "%v", err)
			}
			c.CAWarnings = append(c.CAWarnings, warnings...)
		}
	}
}

// Keypair loads the server certificate and key (the files Resolve
// checked).
func (t TLS) Keypair() (tls.Certificate, error) {
	pair, err := loadKeypair(t.Cert, t.Key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return pair, nil
}

// ClientCAs loads the --tls-ca bundle.
func (t TLS) ClientCAs() (*x509.CertPool, error) {
	pemBytes, err := conffile.Read(t.CA, conffile.MaxPEMBytes)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate found", t.CA)
	}
	return pool, nil
}

// checkEtcdCerts checks the etcd client certificate and CA bundle, which
// etcdstore.ClientConfig.TLSConfig has read and loaded without a problem.
func checkEtcdCerts(c *Config, e *Etcd, now time.Time, p *problems) {
	if e.CertFile != "" && e.KeyFile != "" {
		pair, err := loadKeypair(e.CertFile, e.KeyFile)
		if err != nil {
			p.add("etcd-cert-file", "cannot load the keypair %s / %s: %v", e.CertFile, e.KeyFile, keypairReason(err))
		} else if ct, err := checkChain(CertEtcdClient, e.CertFile, pair, x509.ExtKeyUsageClientAuth, now); err != nil {
			p.add("etcd-cert-file", "%v", err)
		} else {
			c.Certs = append(c.Certs, ct)
		}
	}
	if e.CAFile != "" {
		warnings, err := checkCABundle(e.CAFile, now)
		if err != nil {
			p.add("etcd-ca-file", "%v", err)
		}
		c.CAWarnings = append(c.CAWarnings, warnings...)
	}
}

// checkClientCerts checks the client certificate chains the hypervisor's
// real backend presents, like the provider's own.
func checkClientCerts(c *Config, certs []plugin.CertFile, now time.Time, p *problems) {
	for _, cf := range certs {
		pair, err := loadKeypair(cf.Cert, cf.Key)
		if err != nil {
			p.add(cf.Flag, "%s: cannot load the %s keypair %s / %s: %v", cf.Context, cf.Noun, cf.Cert, cf.Key, keypairReason(err))
			continue
		}
		ct, err := checkChain(cf.Role, cf.Cert, pair, x509.ExtKeyUsageClientAuth, now)
		if err != nil {
			p.add(cf.Flag, "%s: %s certificate %v", cf.Context, cf.Noun, err)
			continue
		}
		c.Certs = append(c.Certs, ct)
	}
}

// keypairReason strips a *PathError's op so the message reads naturally.
func keypairReason(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %v", pe.Path, pe.Err)
	}
	return err
}
