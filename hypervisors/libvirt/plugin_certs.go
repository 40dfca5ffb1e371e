package libvirt

import (
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/bigfleet-vm/provider/plugin"
)

// CertClientRole is the role label of a libvirt TLS client certificate
// (bigfleet_provider_certificate_expiry_seconds{role}).
const CertClientRole = "libvirt-client"

// Certs names the client certificate of every qemu+tls:// zone that has
// one where go-libvirt will look, once each; the core checks them at
// start like its own. Only the real backend presents them.
func (l *Settings) Certs() []plugin.CertFile {
	if !l.real {
		return nil
	}
	var out []plugin.CertFile
	checked := map[string]bool{}
	for _, zu := range l.Connect {
		u, err := url.Parse(zu.URI)
		if err != nil {
			continue
		}
		cert, key := clientCert(u)
		if cert == "" || checked[cert] {
			continue
		}
		checked[cert] = true
		out = append(out, plugin.CertFile{Flag: "connect", Role: CertClientRole, Cert: cert, Key: key,
			Context: fmt.Sprintf("zone %q", zu.Zone), Noun: "libvirt TLS client"})
	}
	return out
}

// clientCert names the client certificate and key a qemu+tls:// URI
// presents, found where go-libvirt looks (its pkipath, else
// ~/.pki/libvirt for a non-root user, then /etc/pki/libvirt), or "" when
// none is there (the dial then reports it).
func clientCert(u *url.URL) (cert, key string) {
	if !isTLSURI(u) {
		return "", ""
	}
	type dirs struct{ cert, key string }
	var search []dirs
	if pki := u.Query().Get("pkipath"); pki != "" {
		search = []dirs{{pki, pki}}
	} else {
		if cur, err := user.Current(); err != nil || cur.Uid != "0" {
			if cur != nil {
				d := filepath.Join(cur.HomeDir, ".pki", "libvirt")
				search = append(search, dirs{d, d})
			}
		}
		search = append(search, dirs{"/etc/pki/libvirt", "/etc/pki/libvirt/private"})
	}
	for _, d := range search {
		c := filepath.Join(d.cert, "clientcert.pem")
		if _, err := os.Stat(c); err == nil {
			return c, filepath.Join(d.key, "clientkey.pem")
		}
	}
	return "", ""
}

// isTLSURI reports whether a libvirt URI dials over TLS (qemu+tls://, or
// a bare remote qemu://host/...).
func isTLSURI(u *url.URL) bool {
	_, transport, _ := strings.Cut(strings.ToLower(u.Scheme), "+")
	return transport == "tls" || transport == "" && u.Host != ""
}
