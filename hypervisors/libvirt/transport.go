package libvirt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// dialError turns a failed dial into an error an operator can act on: it
// names the transport, what was refused and which file to look at, and
// keeps the original in the chain. Host-key and certificate refusals are
// ErrPermission (retrying cannot help until someone fixes the files); the
// rest stay as they are (the zone is unreachable and redialled).
func dialError(u *url.URL, err error) error {
	uri := hypervisors.RedactURL(u.String())
	q := u.Query()
	var ke *knownhosts.KeyError
	switch {
	case errors.As(err, &ke) && len(ke.Want) == 0:
		return fmt.Errorf("dial %s: %w: host key of %s is not in %s; known_hosts_verify=normal refuses unknown hosts (add the key, e.g. with ssh-keyscan): %w",
			uri, hypervisors.ErrPermission, u.Host, knownHostsFile(u), err)
	case errors.As(err, &ke):
		return fmt.Errorf("dial %s: %w: host key of %s does not match %s (the host key changed, or someone is in between): refused: %w",
			uri, hypervisors.ErrPermission, u.Host, knownHostsFile(u), err)
	case strings.Contains(err.Error(), "knownhosts: key mismatch"):
		return fmt.Errorf("dial %s: %w: host key of %s does not match %s: refused: %w", uri, hypervisors.ErrPermission, u.Host, knownHostsFile(u), err)
	case strings.Contains(err.Error(), "knownhosts: key is unknown"):
		return fmt.Errorf("dial %s: %w: host key of %s is not in %s: refused: %w", uri, hypervisors.ErrPermission, u.Host, knownHostsFile(u), err)
	case strings.Contains(err.Error(), "unable to authenticate"):
		return fmt.Errorf("dial %s: %w: ssh authentication as %q failed (keyfile %s): %w", uri, hypervisors.ErrPermission, u.User.Username(), q.Get("keyfile"), err)
	}
	var silent *tlsSilentError
	var refused *tlsRefusedError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var ae tls.AlertError
	pki := q.Get("pkipath")
	if pki == "" {
		pki = "/etc/pki (libvirt's default locations)"
	}
	switch {
	case errors.As(err, &silent):
		// Not a refusal: nothing that speaks TLS answered. The zone is
		// unreachable and redialled.
		return fmt.Errorf("dial %s: no TLS answer: %w (is libvirtd listening there with listen_tls = 1, or is a proxy in front of it without its upstream?)",
			uri, err)
	case errors.As(err, &refused):
		return fmt.Errorf("dial %s: %w: libvirtd refused our client certificate %s after the TLS handshake (is it signed by the CA libvirtd trusts, and allowed by its tls_allowed_dn_list?): %w",
			uri, hypervisors.ErrPermission, filepath.Join(pki, "clientcert.pem"), err)
	case errors.As(err, &ua):
		return fmt.Errorf("dial %s: %w: the server certificate is not signed by the CA in %s: refused: %w",
			uri, hypervisors.ErrPermission, filepath.Join(pki, "cacert.pem"), err)
	case errors.As(err, &hn):
		return fmt.Errorf("dial %s: %w: the server certificate is not valid for %s: refused: %w", uri, hypervisors.ErrPermission, u.Hostname(), err)
	case errors.As(err, &ci):
		return fmt.Errorf("dial %s: %w: the server certificate is invalid: %w", uri, hypervisors.ErrPermission, err)
	case errors.As(err, &ae), strings.Contains(err.Error(), "server verification (of our certificate"),
		strings.Contains(err.Error(), "tls: bad certificate"), strings.Contains(err.Error(), "certificate required"),
		strings.Contains(err.Error(), "unknown certificate authority"):
		return fmt.Errorf("dial %s: %w: libvirtd refused our client certificate %s (is it signed by the CA libvirtd trusts, and allowed by its tls_allowed_dn_list?): %w",
			uri, hypervisors.ErrPermission, filepath.Join(pki, "clientcert.pem"), err)
	case errors.Is(err, fs.ErrNotExist) && strings.Contains(err.Error(), "tls client cert"):
		return fmt.Errorf("dial %s: %w: no client certificate: qemu+tls needs clientcert.pem and clientkey.pem in %s: %w",
			uri, hypervisors.ErrPermission, pki, err)
	case errors.Is(err, fs.ErrNotExist) && strings.Contains(err.Error(), "CA cert"):
		return fmt.Errorf("dial %s: %w: no CA certificate: qemu+tls needs cacert.pem in %s: %w", uri, hypervisors.ErrPermission, pki, err)
	}
	return fmt.Errorf("dial %s: %w", uri, err)
}

// knownHostsFile is the known_hosts file go-libvirt checks for u.
func knownHostsFile(u *url.URL) string {
	if f := u.Query().Get("known_hosts"); f != "" {
		return f
	}
	if strings.HasSuffix(u.Scheme, "+ssh") {
		return "~/.ssh/known_hosts"
	}
	return "$XDG_CONFIG_HOME/libvirt/known_hosts"
}
