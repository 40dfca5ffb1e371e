package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/retry"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Client defaults.
const (
	DefaultDialTimeout      = 5 * time.Second
	DefaultKeepAliveTime    = 10 * time.Second
	DefaultKeepAliveTimeout = 5 * time.Second
	// clientSendLimit is the client's own cap on a request; the server's
	// --max-request-bytes (Options.MaxRequestBytes) is the real bound.
	clientSendLimit = 16 << 20
)

// ClientConfig says how to reach an etcd cluster.
type ClientConfig struct {
	// Endpoints are the members' "host:port" addresses (see ParseURL).
	Endpoints []string
	// CAFile is a PEM bundle of CAs that sign the members' serving
	// certificates. Any of the three files turns TLS on; without CAFile the
	// system roots verify the members.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key for
	// etcd's --client-cert-auth; both or neither.
	CertFile, KeyFile string
	// DialTimeout bounds the connectivity probe New makes; zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// KeepAliveTime and KeepAliveTimeout are the gRPC keepalive ping interval
	// and the time a ping may go unanswered before the connection is
	// dropped; zero means the defaults. etcd's server refuses pings more
	// often than its --grpc-keepalive-min-time (5 s by default).
	KeepAliveTime, KeepAliveTimeout time.Duration
}

// FileError is a problem with one of a ClientConfig's files. File says
// which: "ca", "cert" or "key", so a caller can name its own flag.
type FileError struct {
	File string
	Err  error
}

func (e *FileError) Error() string { return e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// TLSConfig builds the client TLS configuration the files describe: nil
// (plain TCP) when no file is set, else TLS 1.2 or later that verifies the
// members against CAFile (or the system roots) and presents the client
// certificate if one is set. Every problem with the files is reported.
func (c ClientConfig) TLSConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" && c.KeyFile == "" {
		return nil, nil
	}
	var errs *multierror.Error
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := readPEM(c.CAFile)
		if err != nil {
			errs = multierror.Append(errs, &FileError{"ca", fmt.Errorf("etcd CA file: %w", err)})
		} else {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				errs = multierror.Append(errs, &FileError{"ca", fmt.Errorf("etcd CA file %s: no PEM certificate in it", c.CAFile)})
			}
			cfg.RootCAs = pool
		}
	}
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		errs = multierror.Append(errs, &FileError{"cert", errors.New("etcd client certificate given without --etcd-key-file")})
	case c.CertFile == "" && c.KeyFile != "":
		errs = multierror.Append(errs, &FileError{"key", errors.New("etcd client key given without --etcd-cert-file")})
	case c.CertFile != "":
		certPEM, cerr := readPEM(c.CertFile)
		if cerr != nil {
			errs = multierror.Append(errs, &FileError{"cert", fmt.Errorf("etcd certificate file: %w", cerr)})
		}
		keyPEM, kerr := readPEM(c.KeyFile)
		if kerr != nil {
			errs = multierror.Append(errs, &FileError{"key", fmt.Errorf("etcd key file: %w", kerr)})
		}
		if cerr == nil && kerr == nil {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				errs = multierror.Append(errs, &FileError{"cert", fmt.Errorf("etcd client certificate %s with key %s: %w", c.CertFile, c.KeyFile, err)})
			} else {
				cfg.Certificates = []tls.Certificate{pair}
			}
		}
	}
	if err := errs.ErrorOrNil(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// readPEM reads a CA, certificate or key file: a regular file of at most
// conffile.MaxPEMBytes (a FIFO or a device is refused, never waited on).
func readPEM(path string) ([]byte, error) {
	return conffile.Read(path, conffile.MaxPEMBytes)
}

// NewClient proves it can talk to the cluster and then connects: it
// returns only after one member answered a request within DialTimeout,
// so a wrong CA, a rejected client certificate or an unreachable cluster
// fails here with the transport's reason rather than later as a timeout.
// The caller closes the client.
func NewClient(ctx context.Context, cfg ClientConfig) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("connect to etcd: no endpoints")
	}
	tlsCfg, err := cfg.TLSConfig()
	if err != nil {
		return nil, fmt.Errorf("connect to etcd: %w", err)
	}
	dial := orDefault(cfg.DialTimeout, DefaultDialTimeout)
	if err := probe(ctx, cfg.Endpoints, tlsCfg, dial); err != nil {
		return nil, err
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          dial,
		DialKeepAliveTime:    orDefault(cfg.KeepAliveTime, DefaultKeepAliveTime),
		DialKeepAliveTimeout: orDefault(cfg.KeepAliveTimeout, DefaultKeepAliveTimeout),
		MaxCallSendMsgSize:   clientSendLimit,
		TLS:                  tlsCfg,
		Logger:               zap.NewNop(),
		Context:              ctx,
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", cfg.Endpoints, err)
	}
	return c, nil
}

// probe asks each endpoint for its status, over a connection of its own
// with the client's TLS settings, until one answers. The calls do not wait
// for a ready connection, so a failed attempt carries the transport's
// reason (a failed TLS handshake, a refused client certificate, a refused
// connection), which the error reports per endpoint.
func probe(ctx context.Context, endpoints []string, tlsCfg *tls.Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conns := make([]*grpc.ClientConn, len(endpoints))
	for i, ep := range endpoints {
		conn, err := grpc.NewClient("passthrough:///"+ep, grpc.WithTransportCredentials(creds))
		if err != nil {
			return fmt.Errorf("connect to etcd %s: %w", ep, err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	last := make([]error, len(endpoints))
	b := retry.EtcdConnect.Backoff()
	for {
		for i, conn := range conns {
			actx, acancel := context.WithTimeout(ctx, time.Second)
			_, err := pb.NewMaintenanceClient(conn).Status(actx, &pb.StatusRequest{}, grpc.WaitForReady(false))
			acancel()
			if err == nil {
				return nil
			}
			if ctx.Err() == nil || last[i] == nil {
				last[i] = err
			}
		}
		select {
		case <-ctx.Done():
			var errs *multierror.Error
			for i, ep := range endpoints {
				if tlsCfg != nil {
					if terr := diagnoseTLS(ep, tlsCfg); terr != nil {
						last[i] = terr
					}
				}
				errs = multierror.Append(errs, fmt.Errorf("%s: %w", ep, last[i]))
			}
			return fmt.Errorf("connect to etcd: no member answered within %v: %w", timeout, errs)
		case <-time.After(b.Next()):
		}
	}
}

// diagnoseTLS makes one TLS handshake with ep and reports what went wrong
// with it, or nil if nothing did. With TLS 1.3 a member refuses a client
// certificate only after the handshake, with an alert the next read
// returns, and gRPC often reports just the broken pipe; this read catches
// the alert itself.
func diagnoseTLS(ep string, tlsCfg *tls.Config) error {
	d := &net.Dialer{Timeout: time.Second}
	raw, err := d.Dial("tcp", ep)
	if err != nil {
		return nil
	}
	defer raw.Close()
	cfg := tlsCfg.Clone()
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(ep)
		cfg.ServerName = host
	}
	conn := tls.Client(raw, cfg)
	conn.SetDeadline(time.Now().Add(time.Second))
	if err := conn.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	var op *net.OpError
	if _, err := conn.Read(make([]byte, 1)); errors.As(err, &op) && op.Op == "remote error" {
		return fmt.Errorf("the member refused this client's certificate: %w", err)
	}
	return nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
