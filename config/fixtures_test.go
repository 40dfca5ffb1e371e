package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-multierror"
)

// files are temporary stand-ins for the paths the seed docs use.
type files struct {
	dir                                       string
	lvOfferings, pxOfferings, catalog         string
	hugeOfferings                             string
	token, pveCA, serverCert, serverKey       string
	clientCA, userData, empty, garbage, noDir string
}

const tokenSecret = "0f9e8d7c-TOKEN-SECRET-6b5a"

func writeFile(t *testing.T, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// selfSigned returns a PEM certificate and PEM private key.
func selfSigned(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		DNSNames:              []string{cn},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func newFiles(t *testing.T) files {
	t.Helper()
	dir := t.TempDir()
	cert, key := selfSigned(t, "provider.example.internal")
	ca, _ := selfSigned(t, "pve-root-ca")
	client, _ := selfSigned(t, "client-ca")
	f := files{dir: dir}
	f.lvOfferings = writeFile(t, filepath.Join(dir, "offerings-libvirt.json"), []byte(`[
  {"instance_type": "kvm.small", "zone": "rack1", "capacity_type": "on_demand", "count": 8, "resources": {"cpu": "1", "memory": "2Gi"}},
  {"instance_type": "kvm.large", "zone": "rack2", "capacity_type": "on_demand", "count": 4, "resources": {"cpu": "2", "memory": "4Gi"}, "labels": {"team": "batch"}}
]`))
	f.pxOfferings = writeFile(t, filepath.Join(dir, "offerings-proxmox.json"), []byte(`[
  {"instance_type": "pve.medium", "zone": "pve1", "capacity_type": "on_demand", "count": 8, "resources": {"cpu": "1", "memory": "2Gi"}},
  {"instance_type": "pve.large", "zone": "pve2", "capacity_type": "on_demand", "count": 4, "resources": {"cpu": "2", "memory": "4Gi"}, "labels": {"team": "ml"}}
]`))
	f.hugeOfferings = writeFile(t, filepath.Join(dir, "offerings-huge.json"), []byte(`[
  {"instance_type": "kvm.small", "zone": "local-a", "count": 9223372036854775807},
  {"instance_type": "kvm.large", "zone": "local-a", "count": 1000000},
  {"instance_type": "kvm.large", "zone": "local-b", "count": 2}
]`))
	f.catalog = writeFile(t, filepath.Join(dir, "types.json"), []byte(`{"pve.small": {"vcpu": 2, "memory_mib": 4096, "template_vmid": 9100}}`))
	f.token = writeFile(t, filepath.Join(dir, "token"), []byte("  "+tokenSecret+"\n"))
	f.pveCA = writeFile(t, filepath.Join(dir, "pve-root-ca.pem"), ca)
	f.serverCert = writeFile(t, filepath.Join(dir, "server.pem"), cert)
	f.serverKey = writeFile(t, filepath.Join(dir, "server-key.pem"), key)
	f.clientCA = writeFile(t, filepath.Join(dir, "client-ca.pem"), client)
	f.userData = writeFile(t, filepath.Join(dir, "user-data"), []byte("#cloud-config\n"))
	f.empty = writeFile(t, filepath.Join(dir, "empty"), nil)
	f.garbage = writeFile(t, filepath.Join(dir, "garbage"), []byte("not pem\n"))
	f.noDir = filepath.Join(dir, "missing", "file")
	return f
}

// expand replaces the seed docs' file paths with the temporary ones.
func (f files) expand(args []string, offerings string) []string {
	r := strings.NewReplacer(
		"/etc/bigfleet/offerings.json", offerings,
		"/etc/bigfleet/proxmox-token/token", f.token,
		"/etc/pve/pve-root-ca.pem", f.pveCA,
		"server-key.pem", f.serverKey,
		"server.pem", f.serverCert,
		"client-ca.pem", f.clientCA,
		"$DIR", f.dir,
	)
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = r.Replace(a)
	}
	return out
}

// lines splits a Resolve error into its problems.
func lines(err error) []string {
	if err == nil {
		return nil
	}
	var me *multierror.Error
	if errors.As(err, &me) {
		out := make([]string, len(me.Errors))
		for i, e := range me.Errors {
			out[i] = e.Error()
		}
		return out
	}
	return []string{err.Error()}
}
