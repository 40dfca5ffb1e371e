package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/bigfleet-vm/provider/internal/freeport"
)

// CompactionRetention is the periodic auto-compaction retention members
// run with unless Options.CompactionRetention says otherwise: short, so
// tests meet compacted history.
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
	// NoClientCertAuth, with TLS, accepts clients without a certificate
	// (server-authenticated TLS only).
	NoClientCertAuth bool
	// MaxTxnOps and MaxRequestBytes override etcd's --max-txn-ops and
	// --max-request-bytes when not zero.
	MaxTxnOps       uint
	MaxRequestBytes uint
	// CompactionRetention overrides the package's CompactionRetention
	// when not empty (etcd's duration syntax, "1h").
	CompactionRetention string
}

func (o Options) retention() string {
	if o.CompactionRetention != "" {
		return o.CompactionRetention
	}
	return CompactionRetention
}

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	opts Options
	root string
	// binary is the etcd binary members run as child processes of, or
	// "" for embedded members (BinaryEnv).
	binary  string
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
	etcd      *embed.Etcd // nil while stopped (or external)
	proc      *process    // nil while stopped (or embedded)
}

func (m *member) embedded() bool { return m.etcd != nil }

func (m *member) running() bool { return m.etcd != nil || m.proc != nil }

// Start runs a cluster for tb and stops it when tb ends.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// New runs a cluster that lives until Close, for clusters shared by the
// tests of a package (started and closed in TestMain).
func New(opts Options) (*Cluster, error) {
	if opts.Members == 0 {
		opts.Members = 3
	}
	var err error
	for range bootTries {
		var c *Cluster
		if c, err = boot(opts); err == nil || !freeport.InUse(err) {
			return c, err
		}
		// Another process took a port between the pick and the
		// member's bind: a new cluster on new ports.
	}
	return nil, fmt.Errorf("%w (on %d sets of free ports)", err, bootTries)
}

// pickAddrs picks the members' addresses; a test replaces it to lose
// the race for a port.
var pickAddrs = freeport.Addrs

// bootTries bounds the clusters New starts when a member loses the race
// for its port.
const bootTries = 3

func boot(opts Options) (*Cluster, error) {
	root, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, root: root, binary: Binary()}
	if err := c.boot(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) boot() error {
	scheme := "http"
	if c.opts.TLS {
		certs, err := writeCerts(filepath.Join(c.root, "certs"))
		if err != nil {
			return fmt.Errorf("generate test certificates: %w", err)
		}
		c.Certs = certs
		scheme = "https"
	}
	// Ports outside the ephemeral range: a member dialling its peers
	// cannot take one as its source port before its neighbour listens.
	addrs, err := pickAddrs(2 * c.opts.Members)
	if err != nil {
		return err
	}
	for i := range c.opts.Members {
		c.members = append(c.members, &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(c.root, fmt.Sprintf("m%d", i)),
			clientURL: url.URL{Scheme: scheme, Host: addrs[2*i]},
			peerURL:   url.URL{Scheme: "http", Host: addrs[2*i+1]},
		})
	}
	if err := c.startStopped(); err != nil {
		return err
	}
	_, err = c.waitLeader()
	return err
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
	cfg.AutoCompactionRetention = c.opts.retention()
	if c.opts.MaxTxnOps != 0 {
		cfg.MaxTxnOps = c.opts.MaxTxnOps
	}
	if c.opts.MaxRequestBytes != 0 {
		cfg.MaxRequestBytes = c.opts.MaxRequestBytes
	}
	if c.Certs != nil {
		cfg.ClientTLSInfo.CertFile = c.Certs.ServerCert
		cfg.ClientTLSInfo.KeyFile = c.Certs.ServerKey
		if !c.opts.NoClientCertAuth {
			// etcd asks for client certificates whenever it has a
			// trusted CA file.
			cfg.ClientTLSInfo.TrustedCAFile = c.Certs.CA
			cfg.ClientTLSInfo.ClientCertAuth = true
		}
	}
	return cfg
}

// start runs m and waits until it serves. An existing data directory
// makes etcd ignore the initial cluster and rejoin as the same member.
func (c *Cluster) start(m *member, cluster string) error {
	if c.binary != "" {
		return c.startProcess(m, cluster)
	}
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
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cl, err := c.newClient(c.Endpoints())
	if err != nil {
		tb.Fatal(err)
	}
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// Stop stops member i gracefully (a leader hands its leadership over
// first); its data stays.
func (c *Cluster) Stop(tb testing.TB, i int) {
	tb.Helper()
	m := c.members[i]
	if !m.running() {
		tb.Fatalf("etcd member %s is already stopped", m.name)
	}
	if m.proc != nil {
		m.proc.stop()
		m.proc = nil
		return
	}
	m.etcd.Close()
	m.etcd = nil
}

// Kill stops member i the way a crash would: raft stops at once, without
// handing over leadership, and then its listeners close.
func (c *Cluster) Kill(tb testing.TB, i int) {
	tb.Helper()
	m := c.members[i]
	if !m.running() {
		tb.Fatalf("etcd member %s is already stopped", m.name)
	}
	if m.proc != nil {
		m.proc.kill()
		m.proc = nil
		return
	}
	m.etcd.Server.HardStop()
	m.etcd.Close()
	m.etcd = nil
}

// Restart starts the stopped member i again with its data.
func (c *Cluster) Restart(tb testing.TB, i int) {
	tb.Helper()
	m := c.members[i]
	if m.running() {
		tb.Fatalf("etcd member %s is running", m.name)
	}
	var s []string
	for _, o := range c.members {
		s = append(s, o.name+"="+o.peerURL.String())
	}
	if err := c.start(m, strings.Join(s, ",")); err != nil {
		tb.Fatal(err)
	}
}

// RestartAll starts every stopped member again with its data, all at
// once: members that lost quorum only become ready together.
func (c *Cluster) RestartAll(tb testing.TB) {
	tb.Helper()
	if err := c.startStopped(); err != nil {
		tb.Fatal(err)
	}
}

// startStopped starts every member that does not run. An existing data
// directory makes etcd ignore the initial cluster and rejoin as the same
// member.
func (c *Cluster) startStopped() error {
	var s []string
	for _, m := range c.members {
		s = append(s, m.name+"="+m.peerURL.String())
	}
	initial := strings.Join(s, ",")
	var wg sync.WaitGroup
	errs := make([]error, len(c.members))
	for i, m := range c.members {
		if !m.running() {
			wg.Go(func() { errs[i] = c.start(m, initial) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Running reports whether member i runs.
func (c *Cluster) Running(i int) bool { return c.members[i].running() }

// Leader returns the index of the raft leader among the running members,
// or -1 if none of them knows one.
func (c *Cluster) Leader() int {
	if c.binary != "" {
		return c.externalLeader()
	}
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

// WaitLeader waits until the running members agree on a raft leader that
// serves a linearizable read, and returns its index.
func (c *Cluster) WaitLeader(tb testing.TB) int {
	tb.Helper()
	l, err := c.waitLeader()
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func (c *Cluster) waitLeader() (int, error) {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l >= 0 && c.linearizable(l) == nil {
			return l, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1, fmt.Errorf("etcd cluster has no leader after %v", startTimeout)
}

// Close closes the clients the cluster handed out, stops every member and
// removes the data.
func (c *Cluster) Close() {
	c.mu.Lock()
	for _, cl := range c.clients {
		cl.Close()
	}
	c.clients = nil
	c.mu.Unlock()
	if c.binary != "" {
		// Child processes are killed, not stopped: nothing they hold
		// outlives the cluster, and no member waits for a peer.
		for _, m := range c.members {
			if m.proc != nil {
				m.proc.kill()
				m.proc = nil
			}
		}
		os.RemoveAll(c.root)
		return
	}
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
	os.RemoveAll(c.root)
}
