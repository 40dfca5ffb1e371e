package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BinaryEnv names the environment variable that, set to an etcd binary
// (say /usr/bin/etcd from Debian's etcd-server), makes New and Start run
// every member as a child process of that binary instead of embedding
// the etcd server this module builds with.
const BinaryEnv = "ETCDTEST_BINARY"

// snapshotCount is the embedded members' --snapshot-count (etcd 3.6 and
// later default to 10,000; 3.4 to 100,000): external members get it too.
const snapshotCount = 10000

// stopTimeout bounds how long Stop waits for a member to exit after
// SIGTERM before it kills it.
const stopTimeout = 30 * time.Second

// process is one external member: its child process and what it left.
type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process exited
	err  error         // its exit status, once done
	// client talks to this member alone (Status, readiness reads).
	client *clientv3.Client
}

// Binary is the etcd binary the environment asks members to run as, or ""
// for embedded members.
func Binary() string { return os.Getenv(BinaryEnv) }

// flags are the command-line equivalent of config for an etcd 3.4 or
// later binary.
func (c *Cluster) flags(m *member, cluster string) []string {
	f := []string{
		"--name=" + m.name,
		"--data-dir=" + m.dir,
		"--listen-client-urls=" + m.clientURL.String(),
		"--advertise-client-urls=" + m.clientURL.String(),
		"--listen-peer-urls=" + m.peerURL.String(),
		"--initial-advertise-peer-urls=" + m.peerURL.String(),
		"--initial-cluster=" + cluster,
		"--initial-cluster-token=etcdtest",
		"--initial-cluster-state=new",
		"--auto-compaction-mode=periodic",
		"--auto-compaction-retention=" + c.opts.retention(),
		"--snapshot-count=" + strconv.Itoa(snapshotCount),
		"--heartbeat-interval=100",
		"--election-timeout=1000",
		"--logger=zap",
		"--log-outputs=stderr",
		"--log-level=warn",
	}
	if c.opts.MaxTxnOps != 0 {
		f = append(f, "--max-txn-ops="+strconv.FormatUint(uint64(c.opts.MaxTxnOps), 10))
	}
	if c.opts.MaxRequestBytes != 0 {
		f = append(f, "--max-request-bytes="+strconv.FormatUint(uint64(c.opts.MaxRequestBytes), 10))
	}
	if c.Certs != nil {
		f = append(f, "--cert-file="+c.Certs.ServerCert, "--key-file="+c.Certs.ServerKey)
		if !c.opts.NoClientCertAuth {
			f = append(f, "--trusted-ca-file="+c.Certs.CA, "--client-cert-auth=true")
		}
	}
	return f
}

// startProcess runs m as a child of the binary and waits until it serves
// a linearizable read (it has joined a cluster with a leader), the way an
// embedded member is ready once it published itself to the cluster.
func (c *Cluster) startProcess(m *member, cluster string) error {
	logPath := filepath.Join(c.root, m.name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log of etcd member %s: %w", m.name, err)
	}
	defer logf.Close()
	cmd := exec.Command(c.binary, c.flags(m, cluster)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group (a ^C to the test does not reach it first)
	// and killed with the test process if that dies without Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd member %s (%s): %w", m.name, c.binary, err)
	}
	p := &process{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	cl, err := c.newClient([]string{m.clientURL.Host})
	if err != nil {
		p.kill()
		return err
	}
	p.client = cl
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cl.Get(clientv3.WithRequireLeader(ctx), "etcdtest-ready")
		cancel()
		if err == nil {
			m.proc = p
			return nil
		}
		select {
		case <-p.done:
			p.kill()
			return fmt.Errorf("etcd member %s exited (%v): %s", m.name, p.err, tail(logPath))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("etcd member %s not ready after %v: %v: %s", m.name, startTimeout, err, tail(logPath))
		}
	}
}

// newClient is a client of endpoints with the cluster's TLS, owned by the
// caller.
func (c *Cluster) newClient(endpoints []string) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if c.Certs != nil {
		tlsCfg, err := c.Certs.ClientTLS()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tlsCfg
	}
	cl, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client of %v: %w", endpoints, err)
	}
	return cl, nil
}

// kill sends SIGKILL to the member's process group and waits until the
// process is gone.
func (p *process) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	p.closeClient()
}

// stop sends SIGTERM (a leader hands its leadership over first) and waits
// for the exit, killing the process if it takes longer than stopTimeout.
func (p *process) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.closeClient()
}

func (p *process) closeClient() {
	if p.client != nil {
		p.client.Close()
		p.client = nil
	}
}

// status asks the member for its raft status: its own ID and the leader
// it knows (0: none).
func (p *process) status(host string) (id, leader uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := p.client.Status(ctx, host)
	if err != nil {
		return 0, 0, err
	}
	return r.Header.MemberId, r.Leader, nil
}

// externalLeader is Leader for external members: every running member's
// Status names itself and the leader it knows.
func (c *Cluster) externalLeader() int {
	ids := make([]uint64, len(c.members))
	var leads []uint64
	for i, m := range c.members {
		if m.proc == nil {
			continue
		}
		id, lead, err := m.proc.status(m.clientURL.Host)
		if err != nil {
			continue
		}
		ids[i] = id
		if lead != 0 {
			leads = append(leads, lead)
		}
	}
	for _, lead := range leads {
		for j, id := range ids {
			if id != 0 && id == lead {
				return j
			}
		}
	}
	return -1
}

// linearizable reads through member l alone: it serves reads only while
// it leads a quorum.
func (c *Cluster) linearizable(l int) error {
	m := c.members[l]
	if m.embedded() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return m.etcd.Server.LinearizableReadNotify(ctx)
	}
	if m.proc == nil {
		return errors.New("member stopped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := m.proc.client.Get(clientv3.WithRequireLeader(ctx), "etcdtest-ready")
	return err
}

// tail is the end of a member's log, for an error.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(bytes.TrimSpace(b))
}
