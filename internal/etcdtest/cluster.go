package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// CompactionRetention is the periodic auto-compaction retention members
// run with: short, so tests meet compacted history.
const CompactionRetention = "10s"

// startTimeout bounds how long Start and Restart wait for members.
const startTimeout = 60 * time.Second

// Options shape a cluster. The zero value is three plain-TCP members with
// etcd's default limits.
type Options struct {
	// Members is the member count; zero means 3.
	Members int
	// TLS serves clients over TLS with client-certificate auth; the
	// cluster's Certs name the files.
	TLS bool
	// MaxTxnOps and MaxRequestBytes override etcd's --max-txn-ops and
	// --max-request-bytes when not zero.
	MaxTxnOps       uint
	MaxRequestBytes uint
}

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	tb      testing.TB
	opts    Options
	members []*member
	// Certs names the TLS files when Options.TLS is set.
	Certs *Certs

	mu      sync.Mutex
	clients []*clientv3.Client
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd // nil while stopped
}

// Start runs a cluster for tb and stops it when tb ends.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	if opts.Members == 0 {
		opts.Members = 3
	}
	c := &Cluster{tb: tb, opts: opts}
	tb.Cleanup(c.close)
	root := tb.TempDir()
	scheme := "http"
	if opts.TLS {
		c.Certs = writeCerts(tb, filepath.Join(root, "certs"))
		scheme = "https"
	}
	var initial []string
	for i := range opts.Members {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(root, fmt.Sprintf("m%d", i)),
			clientURL: url.URL{Scheme: scheme, Host: freeAddr(tb)},
			peerURL:   url.URL{Scheme: "http", Host: freeAddr(tb)},
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	cluster := strings.Join(initial, ",")
	var wg sync.WaitGroup
	errs := make([]error, len(c.members))
	for i, m := range c.members {
		wg.Go(func() { errs[i] = c.start(m, cluster) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	c.WaitLeader()
	return c
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *Cluster) config(m *member, cluster string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = cluster
	cfg.InitialClusterToken = "etcdtest"
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.EnableGRPCGateway = false
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = CompactionRetention
	if c.opts.MaxTxnOps != 0 {
		cfg.MaxTxnOps = c.opts.MaxTxnOps
	}
	if c.opts.MaxRequestBytes != 0 {
		cfg.MaxRequestBytes = c.opts.MaxRequestBytes
	}
	if c.Certs != nil {
		cfg.ClientTLSInfo.CertFile = c.Certs.ServerCert
		cfg.ClientTLSInfo.KeyFile = c.Certs.ServerKey
		cfg.ClientTLSInfo.TrustedCAFile = c.Certs.CA
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
	return cfg
}

// start runs m and waits until it serves. An existing data directory
// makes etcd ignore the initial cluster and rejoin as the same member.
func (c *Cluster) start(m *member, cluster string) error {
	e, err := embed.StartEtcd(c.config(m, cluster))
	if err != nil {
		return fmt.Errorf("start etcd member %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd member %s failed: %w", m.name, err)
	case <-time.After(startTimeout):
		e.Close()
		return fmt.Errorf("etcd member %s not ready after %v", m.name, startTimeout)
	}
	m.etcd = e
	return nil
}

func (c *Cluster) initialCluster() string {
	var s []string
	for _, m := range c.members {
		s = append(s, m.name+"="+m.peerURL.String())
	}
	return strings.Join(s, ",")
}

// Endpoints are every member's client address ("127.0.0.1:port"), also of
// stopped members.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL.Host)
	}
	return eps
}

// URL is the --state value naming this cluster with prefix.
func (c *Cluster) URL(prefix string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + "/" + strings.TrimPrefix(prefix, "/")
}

// Client returns a client of every member (over TLS with the client
// certificate when the cluster has TLS); the cluster closes it.
func (c *Cluster) Client() *clientv3.Client {
	c.tb.Helper()
	cfg := clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if c.Certs != nil {
		tlsCfg, err := c.Certs.ClientTLS()
		if err != nil {
			c.tb.Fatal(err)
		}
		cfg.TLS = tlsCfg
	}
	cl, err := clientv3.New(cfg)
	if err != nil {
		c.tb.Fatalf("etcd client: %v", err)
	}
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// Stop stops member i (closing its listeners; its data stays).
func (c *Cluster) Stop(i int) {
	c.tb.Helper()
	m := c.members[i]
	if m.etcd == nil {
		c.tb.Fatalf("etcd member %s is already stopped", m.name)
	}
	m.etcd.Close()
	m.etcd = nil
}

// Kill stops member i the way a crash would: raft stops at once, without
// handing over leadership, and then its listeners close.
func (c *Cluster) Kill(i int) {
	c.tb.Helper()
	m := c.members[i]
	if m.etcd == nil {
		c.tb.Fatalf("etcd member %s is already stopped", m.name)
	}
	m.etcd.Server.HardStop()
	m.etcd.Close()
	m.etcd = nil
}

// Restart starts the stopped member i again with its data.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	m := c.members[i]
	if m.etcd != nil {
		c.tb.Fatalf("etcd member %s is running", m.name)
	}
	if err := c.start(m, c.initialCluster()); err != nil {
		c.tb.Fatal(err)
	}
}

// RestartAll starts every stopped member at once: members that lost
// quorum only become ready together.
func (c *Cluster) RestartAll() {
	c.tb.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(c.members))
	for i, m := range c.members {
		if m.etcd != nil {
			continue
		}
		wg.Go(func() { errs[i] = c.start(m, c.initialCluster()) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			c.tb.Fatal(err)
		}
	}
}

// Running reports whether member i runs.
func (c *Cluster) Running(i int) bool { return c.members[i].etcd != nil }

// Leader returns the index of the raft leader among the running members,
// or -1 if none of them knows one.
func (c *Cluster) Leader() int {
	for _, m := range c.members {
		if m.etcd == nil {
			continue
		}
		lead := m.etcd.Server.Leader()
		for j, o := range c.members {
			if o.etcd != nil && o.etcd.Server.MemberID() == lead {
				return j
			}
		}
	}
	return -1
}

// WaitLeader waits until the running members agree on a raft leader and
// it serves a linearizable read.
func (c *Cluster) WaitLeader() int {
	c.tb.Helper()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := c.members[l].etcd.Server.LinearizableReadNotify(ctx)
			cancel()
			if err == nil {
				return l
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.tb.Fatalf("etcd cluster has no leader after %v", startTimeout)
	return -1
}

func (c *Cluster) close() {
	c.mu.Lock()
	for _, cl := range c.clients {
		cl.Close()
	}
	c.clients = nil
	c.mu.Unlock()
	// Followers first: a leader that stops hands its leadership to a
	// peer and waits for that, which takes etcd's request timeout when the
	// peers are stopping too.
	lead := c.Leader()
	var wg sync.WaitGroup
	for i, m := range c.members {
		if m.etcd != nil && i != lead {
			wg.Go(func() { m.etcd.Close() })
		}
	}
	wg.Wait()
	if lead >= 0 {
		c.members[lead].etcd.Close()
	}
	for _, m := range c.members {
		m.etcd = nil
	}
}
