package libvirt

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// Transport refusals become ErrPermission with the file to look at;
// anything else stays a plain dial error naming the (redacted) URI.
func TestDialError(t *testing.T) {
	libssh := "qemu+libssh://u@h:2222/system?keyfile=/k&known_hosts=/kh&known_hosts_verify=normal"
	tlsURI := "qemu+tls://h/system?pkipath=/pki"
	tests := []struct {
		name, uri  string
		err        error
		permission bool
		want       []string
	}{
		{"unknown host", libssh, fmt.Errorf("ssh: handshake failed: %w", &knownhosts.KeyError{}), true, []string{"not in /kh", "known_hosts_verify=normal"}},
		{"changed host key", libssh, fmt.Errorf("ssh: handshake failed: %w", &knownhosts.KeyError{Want: []knownhosts.KnownKey{{Filename: "/kh"}}}), true, []string{"does not match /kh", "changed"}},
		{"ssh auth", libssh, errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey]"), true, []string{`as "u"`, "keyfile /k"}},
		{"untrusted server cert", tlsURI, fmt.Errorf("tls: failed to verify certificate: %w", x509.UnknownAuthorityError{}), true, []string{"/pki/cacert.pem"}},
		{"no client cert", tlsURI, fmt.Errorf("could not read tls client cert: %w", fs.ErrNotExist), true, []string{"no client certificate", "/pki"}},
		{"client cert refused after the handshake", tlsURI, &tlsRefusedError{addr: "h:16514", err: io.EOF}, true, []string{"refused our client certificate /pki/clientcert.pem", "after the TLS handshake"}},
		// A port that accepts TCP and hangs up before any TLS byte (a
		// relay without upstream, a daemon without its TLS listener) is
		// not a certificate problem.
		{"closed before any TLS answer", tlsURI, &tlsSilentError{addr: "h:16514", err: io.EOF}, false, []string{"no TLS answer", "accepted the TCP connection but sent no TLS answer before it closed it", "listen_tls"}},
		{"silent TLS port", tlsURI, &tlsSilentError{addr: "h:16514", err: os.ErrDeadlineExceeded}, false, []string{"before it timed out"}},
		{"connection refused", tlsURI, errors.New("dial tcp 127.0.0.1:16514: connect: connection refused"), false, []string{"dial qemu+tls://h/system", "connection refused"}},
		{"password redacted", "qemu+ssh://u:secret@h/system", errors.New("boom"), false, []string{"u:xxxxx@h"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.uri)
			if err != nil {
				t.Fatal(err)
			}
			got := dialError(u, tc.err)
			if errors.Is(got, hypervisors.ErrPermission) != tc.permission {
				t.Errorf("%v: permission class = %t, want %t", got, !tc.permission, tc.permission)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not wrap the original", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got.Error(), w) {
					t.Errorf("%v lacks %q", got, w)
				}
			}
			if strings.Contains(got.Error(), "secret") {
				t.Errorf("password leaked: %v", got)
			}
		})
	}
}
