package server

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Bounds of what gRPC clients can hold of the server (docs/security.md).
// Together with the List bound of the service (bytes of encoded answers
// waiting for readers) they cap the memory a client that opens
// connections and streams and then stops reading can pin.
const (
	// MaxConnections is how many gRPC connections are served at once; a
	// connection beyond is closed as soon as it is accepted (the client
	// sees UNAVAILABLE and retries). BigFleet needs a handful; put a proxy
	// in front when untrusted clients can reach --addr.
	MaxConnections = 256
	// MaxStreamsPerConnection is HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS:
	// calls beyond it wait in the client (gRPC queues them).
	MaxStreamsPerConnection = 100
	// MaxHeaderListBytes bounds the request headers (metadata) of a call.
	MaxHeaderListBytes = 64 << 10
)

// limitOptions are the gRPC server options that enforce the bounds:
// streams per connection, header list size, and keepalive (idle
// connections are closed, a client may ping at most every 30 s).
func limitOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
		grpc.MaxHeaderListSize(MaxHeaderListBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 15 * time.Minute, Time: 2 * time.Hour, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
	}
}

// limitListener serves at most max connections at once: one accepted
// beyond is closed at once, and the refusals are logged at most once a
// minute with their count. closed, if set, learns the remote address of
// every connection that closes.
type limitListener struct {
	net.Listener
	sem     chan struct{}
	log     *slog.Logger
	closed  func(remote string)
	refused atomic.Int64
	last    atomic.Int64 // unix nanoseconds of the last refusal logged
}

func newLimitListener(l net.Listener, max int, log *slog.Logger, closed func(remote string)) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, max), log: log, closed: closed}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			remote := c.RemoteAddr().String()
			return &limitConn{Conn: c, release: func() {
				<-l.sem
				if l.closed != nil {
					l.closed(remote)
				}
			}}, nil
		default:
		}
		c.Close()
		n := l.refused.Add(1)
		now := time.Now().UnixNano()
		if last := l.last.Load(); now-last > int64(time.Minute) && l.last.CompareAndSwap(last, now) {
			l.log.Warn("gRPC connection refused: the server holds the most connections it serves at once", "limit", cap(l.sem), "refused_total", n)
		}
	}
}

// limitConn gives its slot back once, when it is closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
