package libvirt

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// The transports are dialled here rather than by go-libvirt's dialers so
// that every step has a deadline (go-libvirt's TLS dialer reads libvirtd's
// certificate-check byte without one, and its SSH dialer bounds only the
// TCP connect) and so that closing a connection closes everything under
// it (go-libvirt's SSH dialer returns the channel and leaks the SSH client
// with its TCP connection and the remote session on every redial).
// Options and defaults follow go-libvirt's dialers (connect_uri.go), which
// follow libvirt's URI documentation.

const (
	defaultSocket  = "/var/run/libvirt/libvirt-sock"
	defaultTLSPort = "16514"
	defaultSSHPort = "22"
)

// transport is the byte stream under one go-libvirt client. Close closes
// all of it (for SSH: the channel, the client and its TCP connection) and
// may be called more than once and concurrently with reads and writes.
type transport struct {
	net.Conn
	extra io.Closer // the SSH client, or nil
	once  sync.Once
	// lastRead is the UnixNano of the last successful read.
	lastRead atomic.Int64
	// handshook, when set, is closed once go-libvirt's handshake call
	// has returned (see Read).
	handshook chan struct{}
}

// handshakeGrace bounds how long the end of the stream is held back for
// a handshake still under way (see Read).
const handshakeGrace = time.Second

// Read also holds the end of the stream back until the handshake has
// returned, for at most handshakeGrace. go-libvirt's ConnectToURI sets
// the channel Disconnected returns after the handshake's last answer,
// while the goroutine it started to watch the socket reads and closes
// that channel as soon as the stream ends. Unordered, the watcher can
// read the old channel first: Disconnected then never fires for this
// connection (and the race detector reports the pair). Held back, the
// stream's end comes after the handshake returned. A handshake waiting
// for an answer cannot return before the stream ends (the end is what
// releases it); that one gets its error handshakeGrace later, and never
// reaches the assignment.
func (t *transport) Read(b []byte) (int, error) {
	n, err := t.Conn.Read(b)
	if n > 0 {
		t.lastRead.Store(time.Now().UnixNano())
	}
	if err != nil && t.handshook != nil {
		select {
		case <-t.handshook:
		default:
			grace := time.NewTimer(handshakeGrace)
			select {
			case <-t.handshook:
			case <-grace.C:
			}
			grace.Stop()
		}
	}
	return n, err
}

func (t *transport) Close() error {
	var err error
	t.once.Do(func() {
		err = t.Conn.Close()
		if t.extra != nil {
			_ = t.extra.Close()
		}
	})
	return err
}

// connected hands go-libvirt a stream that is already open.
type connected struct{ c net.Conn }

func (d connected) Dial() (net.Conn, error) { return d.c, nil }

// connect opens a go-libvirt client on u: the transport, then libvirt's
// own handshake (auth-list, connect-open), all bounded by ctx. On error
// everything opened is closed.
func connect(ctx context.Context, u *url.URL) (*golibvirt.Libvirt, io.Closer, error) {
	tr, err := dialTransport(ctx, u)
	if err != nil {
		return nil, nil, err
	}
	lv := golibvirt.NewWithDialer(connected{tr})
	tr.handshook = make(chan struct{})
	done := make(chan error, 1)
	go func() {
		err := lv.ConnectToURI(golibvirt.RemoteURI(u))
		close(tr.handshook)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			_ = tr.Close()
			return nil, nil, fmt.Errorf("libvirt handshake: %w", err)
		}
		return lv, tr, nil
	case <-ctx.Done():
		// Closing the transport ends the handshake call (go-libvirt
		// releases waiting callers when its socket closes).
		_ = tr.Close()
		return nil, nil, fmt.Errorf("libvirt handshake (auth-list, connect-open): no answer: %w", ctx.Err())
	}
}

// dialTransport opens the byte stream to libvirtd that u names.
func dialTransport(ctx context.Context, u *url.URL) (*transport, error) {
	q := u.Query()
	switch m := strings.ToLower(q.Get("mode")); m {
	case "", "legacy", "auto":
	default:
		return nil, fmt.Errorf("mode=%s is not supported (legacy or auto only)", m)
	}
	switch transportOf(u) {
	case "unix":
		sock := q.Get("socket")
		if sock == "" {
			sock = defaultSocket
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, err
		}
		return &transport{Conn: c}, nil
	case "tls":
		return dialTLS(ctx, u)
	case "ssh", "libssh", "libssh2":
		return dialSSH(ctx, u)
	}
	return nil, fmt.Errorf("transport of %s is not supported", hypervisors.RedactURL(u.String()))
}

// transportOf names u's transport: unix, tls, ssh, libssh, libssh2 or tcp.
func transportOf(u *url.URL) string {
	_, t, _ := strings.Cut(strings.ToLower(u.Scheme), "+")
	if t == "" {
		t = "unix"
		if u.Host != "" {
			t = "tls"
		}
	}
	return t
}

// ---- TLS ----

// tlsSilentError is a TLS dial to which the peer never answered: the TCP
// connection was accepted and then closed (or went silent) before a single
// byte of TLS came back. Nothing that speaks TLS is behind the port: a
// proxy without its upstream, or a libvirtd without its TLS listener
// behind a port someone else holds.
type tlsSilentError struct {
	addr string
	err  error
}

func (e *tlsSilentError) Error() string {
	return fmt.Sprintf("%s accepted the TCP connection but sent no TLS answer before it %s", e.addr, silentHow(e.err))
}

func (e *tlsSilentError) Unwrap() error { return e.err }

// silentDial is the error of a TLS dial to addr that got no TLS answer:
// err, what the handshake saw, and, when ctx has ended, ctx's error too,
// because the end of ctx closes the connection under the handshake and
// the read may then fail on a closed connection before the connection's
// own deadline (the same instant) fires.
func silentDial(ctx context.Context, addr string, err error) *tlsSilentError {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", cerr, err)
	}
	return &tlsSilentError{addr: addr, err: err}
}

func silentHow(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return "closed it"
	}
	return "failed (" + err.Error() + ")"
}

// tlsRefusedError is a TLS dial whose handshake completed on our side but
// which libvirtd then closed or answered with a refusal instead of its
// certificate-check byte: it did not accept our client certificate (with
// TLS 1.3 the client finishes the handshake before the server has checked
// it) or our address.
type tlsRefusedError struct {
	addr string
	err  error
}

func (e *tlsRefusedError) Error() string {
	return fmt.Sprintf("%s completed the TLS handshake and then refused us: %v", e.addr, e.err)
}

func (e *tlsRefusedError) Unwrap() error { return e.err }

// countingConn counts the bytes the peer sent.
type countingConn struct {
	net.Conn
	n atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// pkiFiles are the client certificate, key and CA files for a qemu+tls URI
// (pkipath, else libvirt's default locations).
func pkiFiles(u *url.URL) (cert, key string, cas []string) {
	if p := u.Query().Get("pkipath"); p != "" {
		return filepath.Join(p, "clientcert.pem"), filepath.Join(p, "clientkey.pem"), []string{filepath.Join(p, "cacert.pem")}
	}
	cert, key, cas = "/etc/pki/libvirt/clientcert.pem", "/etc/pki/libvirt/private/clientkey.pem", []string{"/etc/pki/CA/cacert.pem"}
	if usr, err := user.Current(); err == nil && usr.Uid != "0" {
		d := filepath.Join(usr.HomeDir, ".pki", "libvirt")
		if _, err := os.Stat(filepath.Join(d, "clientcert.pem")); err == nil {
			cert, key = filepath.Join(d, "clientcert.pem"), filepath.Join(d, "clientkey.pem")
		}
		cas = append([]string{filepath.Join(d, "cacert.pem")}, cas...)
	}
	return cert, key, cas
}

func tlsConfig(u *url.URL) (*tls.Config, error) {
	certFile, keyFile, cas := pkiFiles(u)
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("could not read tls client cert: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("could not read tls client cert key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("invalid tls client cert %s: %w", certFile, err)
	}
	var caErrs []error
	for _, f := range cas {
		b, err := os.ReadFile(f)
		if err != nil {
			caErrs = append(caErrs, err)
			continue
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("CA cert %s holds no PEM certificate", f)
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}, nil
	}
	return nil, fmt.Errorf("could not read tls CA cert: %w", errors.Join(caErrs...))
}

// dialTLS connects, shakes hands and reads libvirtd's certificate-check
// byte, each bounded by ctx. Its errors say what the peer did: refused the
// TCP connection, closed it without a TLS answer (tlsSilentError), refused
// our certificate during or after the handshake (tlsRefusedError).
func dialTLS(ctx context.Context, u *url.URL) (*transport, error) {
	conf, err := tlsConfig(u)
	if err != nil {
		return nil, err
	}
	port := u.Port()
	if port == "" {
		port = defaultTLSPort
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: raw}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	// The check byte is read without a context: the deadline bounds it,
	// and ctx cancellation closes the connection under it.
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	tc := tls.Client(cc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		if cc.n.Load() == 0 {
			return nil, silentDial(ctx, addr, err)
		}
		return nil, err
	}
	// libvirtd checks our certificate (and address) after the handshake
	// and answers with one byte, 1 meaning accepted.
	b := make([]byte, 1)
	n, err := io.ReadFull(tc, b)
	if err != nil || n != 1 || b[0] != 1 {
		_ = raw.Close()
		if err == nil {
			err = errors.New("server verification (of our certificate or IP address) failed")
		}
		return nil, &tlsRefusedError{addr: addr, err: err}
	}
	if !stop() {
		return nil, ctx.Err()
	}
	_ = raw.SetDeadline(time.Time{})
	return &transport{Conn: tc}, nil
}

// ---- SSH ----

// sshSettings are what a qemu+ssh or qemu+libssh URI asks for.
type sshSettings struct {
	addr, user, password string
	keyFile, knownHosts  string
	socket               string
	auth                 []string // agent, privkey, password (in order)
}

func sshSettingsOf(u *url.URL) (sshSettings, error) {
	q := u.Query()
	s := sshSettings{socket: q.Get("socket"), keyFile: q.Get("keyfile")}
	port := u.Port()
	if port == "" {
		port = defaultSSHPort
	}
	s.addr = net.JoinHostPort(u.Hostname(), port)
	if s.socket == "" {
		s.socket = defaultSocket
	}
	s.user = u.User.Username()
	if s.user == "" {
		if cur, err := user.Current(); err == nil {
			s.user = cur.Username
		}
	}
	s.password, _ = u.User.Password()
	home, _ := os.UserHomeDir()
	if s.keyFile == "" && home != "" {
		for _, k := range []string{"identity", "id_dsa", "id_ecdsa", "id_ed25519", "id_rsa"} {
			if _, err := os.Stat(filepath.Join(home, ".ssh", k)); err == nil {
				s.keyFile = filepath.Join(home, ".ssh", k)
				break
			}
		}
	}
	if transportOf(u) == "ssh" {
		// Like the ssh binary: the user's known_hosts.
		s.knownHosts = filepath.Join(home, ".ssh", "known_hosts")
	} else if s.knownHosts = q.Get("known_hosts"); s.knownHosts == "" {
		if dir, err := os.UserConfigDir(); err == nil {
			s.knownHosts = filepath.Join(dir, "libvirt", "known_hosts")
		}
	}
	s.auth = []string{"agent", "privkey", "password"}
	if a := q.Get("sshauth"); a != "" {
		s.auth = nil
		for _, m := range strings.Split(a, ",") {
			switch m = strings.ToLower(strings.TrimSpace(m)); m {
			case "agent", "privkey", "password":
				s.auth = append(s.auth, m)
			case "keyboard-interactive":
			default:
				return s, fmt.Errorf("invalid ssh auth method %q", m)
			}
		}
	}
	return s, nil
}

// sshAuth builds the auth methods in order; problems reading keys are
// returned so that an authentication failure can name them.
func (s sshSettings) sshAuth() ([]ssh.AuthMethod, []error, func()) {
	var methods []ssh.AuthMethod
	var problems []error
	var signers []ssh.Signer
	var closers []io.Closer
	addSigners := func(more ...ssh.Signer) {
		first := len(signers) == 0
		signers = append(signers, more...)
		// One publickey method serves agent and key file alike.
		if first && len(signers) > 0 {
			methods = append(methods, ssh.PublicKeysCallback(func() ([]ssh.Signer, error) { return signers, nil }))
		}
	}
	for _, m := range s.auth {
		switch m {
		case "agent":
			sock := os.Getenv("SSH_AUTH_SOCK")
			if sock == "" {
				continue
			}
			c, err := net.Dial("unix", sock)
			if err != nil {
				problems = append(problems, fmt.Errorf("ssh agent %s: %w", sock, err))
				continue
			}
			closers = append(closers, c)
			ss, err := agent.NewClient(c).Signers()
			if err != nil {
				problems = append(problems, fmt.Errorf("ssh agent signers: %w", err))
				continue
			}
			addSigners(ss...)
		case "privkey":
			if s.keyFile == "" {
				continue
			}
			b, err := os.ReadFile(s.keyFile)
			if err != nil {
				problems = append(problems, fmt.Errorf("read ssh key %s: %w", s.keyFile, err))
				continue
			}
			k, err := ssh.ParsePrivateKey(b)
			if err != nil {
				problems = append(problems, fmt.Errorf("parse ssh key %s: %w", s.keyFile, err))
				continue
			}
			addSigners(k)
		case "password":
			if s.password != "" {
				methods = append(methods, ssh.Password(s.password))
			}
		}
	}
	return methods, problems, func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}
}

// dialSSH connects, shakes hands (host key checked against known_hosts)
// and opens a channel to the remote libvirt socket, each bounded by ctx.
// The returned transport's Close closes the channel and the client.
func dialSSH(ctx context.Context, u *url.URL) (*transport, error) {
	s, err := sshSettingsOf(u)
	if err != nil {
		return nil, err
	}
	methods, problems, release := s.sshAuth()
	defer release()
	conf := &ssh.ClientConfig{
		User: s.user, Auth: methods,
		HostKeyCallback: func(host string, remote net.Addr, key ssh.PublicKey) error {
			check, err := knownhosts.New(s.knownHosts)
			if err != nil {
				return err
			}
			return check(host, remote, key)
		},
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	// ssh.NewClientConn has no context: the deadline bounds it, and ctx
	// cancellation closes the connection under it.
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	sc, chans, reqs, err := ssh.NewClientConn(raw, s.addr, conf)
	if err != nil {
		_ = raw.Close()
		if strings.Contains(err.Error(), "unable to authenticate") && len(problems) > 0 {
			err = errors.Join(append([]error{err}, problems...)...)
		}
		return nil, err
	}
	client := ssh.NewClient(sc, chans, reqs)
	ch, err := client.Dial("unix", s.socket)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("open the remote libvirt socket %s over ssh: %w", s.socket, err)
	}
	if !stop() {
		_ = client.Close()
		return nil, ctx.Err()
	}
	_ = raw.SetDeadline(time.Time{})
	return &transport{Conn: ch, extra: client}, nil
}
