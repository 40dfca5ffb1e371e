package libvirt

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/internal/freeport"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate (clientcert.pem, clientkey.pem, cacert.pem under pki) and
// returns the server's TLS config, which requires a client certificate.
func testPKI(t *testing.T) (pki string, server *tls.Config) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(n int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(n), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	pemOf := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pemOf("EC PRIVATE KEY", b)
	}
	pki = t.TempDir()
	cDER, cKey := issue(2, x509.ExtKeyUsageClientAuth)
	for name, b := range map[string][]byte{"cacert.pem": pemOf("CERTIFICATE", caDER), "clientcert.pem": pemOf("CERTIFICATE", cDER), "clientkey.pem": keyPEM(cKey)} {
		if err := os.WriteFile(filepath.Join(pki, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sDER, sKey := issue(3, x509.ExtKeyUsageServerAuth)
	cert, err := tls.X509KeyPair(pemOf("CERTIFICATE", sDER), keyPEM(sKey))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pki, &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

// A TLS dial says what the peer did: nothing listening, a port that hangs
// up (or stays silent) before any TLS byte (not a certificate problem: the
// stall note's "daemon without its listener" behind a relay), a daemon
// that completes the handshake and then refuses us, or one that accepts.
func TestDialTLSSaysWhatItSaw(t *testing.T) {
	pki, srvConf := testPKI(t)
	serve := func(t *testing.T, handle func(net.Conn)) string {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go handle(c)
			}
		}()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		return port
	}
	tlsAnswer := func(b byte) func(net.Conn) {
		return func(c net.Conn) {
			defer c.Close()
			tc := tls.Server(c, srvConf)
			if tc.Handshake() != nil {
				return
			}
			_, _ = tc.Write([]byte{b})
			time.Sleep(200 * time.Millisecond)
		}
	}
	silent := make(chan struct{})
	t.Cleanup(func() { close(silent) })
	// A port nothing listens on, outside the ephemeral range: a port of
	// that range, free a moment ago, can be handed to the very next
	// listener on :0, one of the servers below included (CI once dialled
	// "accepts" there and the dial succeeded).
	free, err := freeport.Addrs(1)
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort, _ := net.SplitHostPort(free[0])
	tests := []struct {
		name, port string
		ok         bool
		silentWord string // tlsSilentError with this word, or
		refused    bool   // tlsRefusedError
	}{
		{"nothing listening", closedPort, false, "", false},
		{"hangs up at once", serve(t, func(c net.Conn) { c.Close() }), false, "closed it", false},
		{"never answers", serve(t, func(c net.Conn) { <-silent; c.Close() }), false, "timed out", false},
		{"refuses after the handshake", serve(t, tlsAnswer(0)), false, "", true},
		{"hangs up after the handshake", serve(t, func(c net.Conn) {
			tc := tls.Server(c, srvConf)
			_ = tc.Handshake()
			c.Close()
		}), false, "", true},
		{"accepts", serve(t, tlsAnswer(1)), true, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := url.Parse("qemu+tls://127.0.0.1:" + tc.port + "/system?pkipath=" + pki)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			tr, err := dialTLS(ctx, u)
			if tc.ok {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				tr.Close()
				return
			}
			if err == nil {
				tr.Close()
				t.Fatal("dial succeeded")
			}
			var se *tlsSilentError
			var re *tlsRefusedError
			switch {
			case tc.silentWord != "":
				if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.silentWord) {
					t.Errorf("err %v, want no TLS answer (%s)", err, tc.silentWord)
				}
				if de := dialError(u, err); errors.Is(de, hypervisors.ErrPermission) || strings.Contains(de.Error(), "certificate") {
					t.Errorf("dial error %q blames a certificate", de)
				}
			case tc.refused:
				if !errors.As(err, &re) {
					t.Errorf("err %v, want a refusal after the handshake", err)
				}
				if de := dialError(u, err); !errors.Is(de, hypervisors.ErrPermission) || !strings.Contains(de.Error(), "refused our client certificate") {
					t.Errorf("dial error %q, want a refused client certificate", de)
				}
			default:
				if errors.As(err, &se) || errors.As(err, &re) || !strings.Contains(err.Error(), "refused") {
					t.Errorf("err %v, want connection refused", err)
				}
			}
		})
	}
}

// TestSilentTimeoutWhenTheCloseWins: a silent peer is reported as timed
// out also when the context's end closed the connection under the
// handshake, so that the handshake failed reading a closed connection
// before any deadline fired. CI once saw "failed (… use of closed network
// connection)" from TestDialTLSSaysWhatItSaw/never_answers.
func TestSilentTimeoutWhenTheCloseWins(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	<-ctx.Done()
	closedRead := &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	err := silentDial(ctx, "127.0.0.1:1", closedRead)
	if !strings.Contains(err.Error(), "timed out") {
		t.Errorf("err %v, want no TLS answer (timed out)", err)
	}
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("err %v lost what the handshake saw", err)
	}
	// While the context lives, the error speaks for itself.
	if err := silentDial(context.Background(), "127.0.0.1:1", closedRead); strings.Contains(err.Error(), "timed out") {
		t.Errorf("err %v: timed out without a deadline", err)
	}
}
