package config

import (
	"errors"
	"fmt"

	"net"
	"os"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/bigfleet-vm/provider/etcdstore"
)

// defaultLeaderLease is --leader-lease's default; its bounds are in
// DurationBounds (etcd leases count whole seconds, and a lease much
// longer than a minute would leave the fleet without a leader that long
// after a crash).
const defaultLeaderLease = 5 * time.Second

// Etcd is set when --state names an etcd cluster: every replica given the
// same URL shares the desired state there and one elected leader acts on
// it (docs/high-availability.md).
type Etcd struct {
	Endpoints []string
	Prefix    string
	// CAFile, CertFile and KeyFile are --etcd-ca-file, --etcd-cert-file and
	// --etcd-key-file.
	CAFile, CertFile, KeyFile string
	// LeaseTTL is --leader-lease: how long a leader that stopped renewing
	// (crashed, paused, cut off) keeps the election.
	LeaseTTL time.Duration
	// Identity names this replica to the others (--advertise-addr).
	Identity string
}

// Client is the etcd client configuration.
func (e *Etcd) Client() etcdstore.ClientConfig {
	return etcdstore.ClientConfig{Endpoints: e.Endpoints, CAFile: e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile}
}

func (f *Flags) registerEtcd(fsString func(name, value, usage string) *string, fsDuration func(name string, value time.Duration, usage string) *time.Duration) {
	f.etcdCA = fsString("etcd-ca-file", "", "With --state etcd://...: CA bundle (PEM) that verifies the etcd members; enables TLS.")
	f.etcdCert = fsString("etcd-cert-file", "", "With --state etcd://...: client certificate (PEM) for etcd's --client-cert-auth; with --etcd-key-file.")
	f.etcdKey = fsString("etcd-key-file", "", "With --state etcd://...: the client certificate's private key (PEM).")
	f.leaderLease = fsDuration("leader-lease", defaultLeaderLease, "With --state etcd://...: lease of the elected leader, whole seconds from 2s to 1m: a crashed leader is replaced after about this long.")
	f.advertiseAddr = fsString("advertise-addr", "", "With --state etcd://...: how this replica is named to clients of the others while it leads (default <hostname>:<port of --addr>).")
}

// etcdFileFlag names the flag an etcd client-file problem is about.
func etcdFileFlag(err error) string {
	var fe *etcdstore.FileError
	if errors.As(err, &fe) {
		return "etcd-" + fe.File + "-file"
	}
	return "etcd-ca-file"
}

// resolveEtcd reads an etcd:// --state and the flags that go with it.
func (f *Flags) resolveEtcd(c *Config, set map[string]bool, p *problems) {
	etcdFlags := []string{"etcd-ca-file", "etcd-cert-file", "etcd-key-file", "leader-lease", "advertise-addr"}
	if !etcdstore.IsURL(c.StatePath) {
		for _, n := range etcdFlags {
			if set[n] {
				p.add(n, "only applies to an etcd state (--state etcd://HOST:PORT[,HOST:PORT...]/PREFIX)")
			}
		}
		return
	}
	endpoints, prefix, err := etcdstore.ParseURL(c.StatePath)
	if err != nil {
		p.add("state", "%v", err)
		return
	}
	e := &Etcd{Endpoints: endpoints, Prefix: prefix, CAFile: *f.etcdCA, CertFile: *f.etcdCert, KeyFile: *f.etcdKey,
		LeaseTTL: *f.leaderLease, Identity: *f.advertiseAddr}
	if _, err := e.Client().TLSConfig(); err != nil {
		var merr *multierror.Error
		if errors.As(err, &merr) {
			for _, one := range merr.Errors {
				p.add(etcdFileFlag(one), "%v", one)
			}
		} else {
			p.add("etcd-ca-file", "%v", err)
		}
	} else {
		checkEtcdCerts(c, e, time.Now(), p)
	}
	p.duration("leader-lease", e.LeaseTTL)
	if e.Identity == "" {
		host, _ := os.Hostname()
		_, port, err := net.SplitHostPort(c.Addr)
		if err != nil || host == "" {
			p.add("advertise-addr", "cannot be derived from the hostname and --addr %q; pass it, e.g. 10.0.0.5:9000", c.Addr)
		}
		e.Identity = fmt.Sprintf("%s:%s", host, port)
	}
	c.Etcd = e
}
