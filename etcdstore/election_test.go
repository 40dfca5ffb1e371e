package etcdstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestNewElectorRejects(t *testing.T) {
	c := sharedCluster(t)
	cl := newClient(t, c)
	tests := []struct {
		name, prefix, identity string
		opts                   ElectionOptions
		err                    string
	}{
		{name: "empty-identity", prefix: "/p", err: "empty replica identity"},
		{name: "long-identity", prefix: "/p", identity: strings.Repeat("x", MaxIdentityBytes+1), err: "more than the 256 allowed"},
		{name: "control-identity", prefix: "/p", identity: "a\nb", err: "non-printable"},
		{name: "no-slash", prefix: "p", identity: "a", err: "must start with /"},
		{name: "trailing-slash", prefix: "/p/", identity: "a", err: "must start with /"},
		{name: "negative-ttl", prefix: "/p", identity: "a", opts: ElectionOptions{TTL: -time.Second}, err: "outside"},
		{name: "huge-ttl", prefix: "/p", identity: "a", opts: ElectionOptions{TTL: time.Hour}, err: "outside"},
		{name: "margin-too-big", prefix: "/p", identity: "a", opts: ElectionOptions{TTL: 2 * time.Second, Margin: time.Second}, err: "under half"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewElector(cl, tt.prefix, tt.identity, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("NewElector error = %v, want one containing %q", err, tt.err)
			}
		})
	}
}

// TestOneLeader runs two replicas: only one leads, the standby names it,
// and when the leader's session is killed (its lease revoked) the standby
// takes over while the deposed term can no longer write.
func TestOneLeader(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("one")
	cla, clb := newClient(t, c), newClient(t, c)
	a := newElector(t, cla, prefix, "replica-a 10.0.0.1:7443", testTTL)
	b := newElector(t, clb, prefix, "replica-b 10.0.0.2:7443", testTTL)
	if _, err := b.Leader(ctxFor(t)); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader before any campaign: %v, want ErrNoLeader", err)
	}
	observed := make(chan string, 16)
	octx, ostop := context.WithCancel(context.Background())
	ostopped := make(chan error, 1)
	go func() { ostopped <- b.Observe(octx, func(id string) { observed <- id }) }()
	t.Cleanup(func() {
		ostop()
		if err := <-ostopped; !errors.Is(err, context.Canceled) {
			t.Errorf("Observe returned %v, want context.Canceled", err)
		}
	})
	observe := func(want string) {
		t.Helper()
		select {
		case got := <-observed:
			if got != want {
				t.Errorf("observed leader %q, want %q", got, want)
			}
		case <-time.After(wait):
			t.Fatalf("observer did not report %q", want)
		}
	}
	observe("")
	ta := lead(t, a)
	observe(a.Identity())
	sa := openStore(t, cla, prefix, ta, Options{})
	if _, err := sa.Load(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := commit(t, sa, Op{Key: "k1", Value: []byte("from a")}); err != nil {
		t.Fatal(err)
	}

	won := make(chan *Term, 1)
	go func() {
		tb, err := b.Campaign(context.Background())
		if err != nil {
			t.Error(err)
		}
		won <- tb
	}()
	waitCandidates(t, cla, prefix, 2)
	for _, e := range []*Elector{a, b} {
		if got, err := e.Leader(ctxFor(t)); err != nil || got != a.Identity() {
			t.Errorf("%s sees leader %q (%v), want %q", e.Identity(), got, err, a.Identity())
		}
	}
	select {
	case <-won:
		t.Fatal("the standby won while the leader's lease was alive")
	default:
	}

	// Kill the leader's session from outside.
	killed := time.Now()
	if _, err := clb.Revoke(ctxFor(t), ta.Lease()); err != nil {
		t.Fatal(err)
	}
	var tb *Term
	select {
	case tb = <-won:
	case <-time.After(wait):
		t.Fatal("the standby did not take over")
	}
	if tb == nil {
		t.FailNow()
	}
	t.Cleanup(func() { tb.Resign(context.Background()) })
	t.Logf("takeover %v after the revoke", time.Since(killed).Round(time.Millisecond))
	select {
	case <-ta.Done():
	case <-time.After(wait):
		t.Fatal("the deposed term's Done did not close")
	}
	if err := ta.Err(); !errors.Is(err, ErrNotLeader) {
		t.Errorf("deposed term Err() = %v, want ErrNotLeader", err)
	}
	if tb.Revision() <= ta.Revision() {
		t.Errorf("new term revision %d is not after the old one's %d", tb.Revision(), ta.Revision())
	}
	if got, err := a.Leader(ctxFor(t)); err != nil || got != b.Identity() {
		t.Errorf("leader after takeover = %q (%v), want %q", got, err, b.Identity())
	}
	observe(b.Identity())

	// The deposed store fails, and a write carrying the old guard does
	// not apply.
	if err := commit(t, sa, Op{Key: "k2", Value: []byte("from a, deposed")}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("deposed Commit: %v, want ErrNotLeader", err)
	}
	if err := sa.Healthy(); !errors.Is(err, ErrNotLeader) {
		t.Errorf("deposed Healthy() = %v, want ErrNotLeader", err)
	}
	raw, err := cla.Txn(ctxFor(t)).If(ta.Guard()).Then(clientv3.OpPut(prefix+"/state/k3", "raw from a")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if raw.Succeeded {
		t.Error("a txn guarded by the deposed term applied")
	}

	sb := openStore(t, clb, prefix, tb, Options{})
	loaded, err := sb.Load(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"k1": "from a"}, strMap(loaded)); diff != "" {
		t.Errorf("new leader loaded (-want +got):\n%s", diff)
	}
	if err := commit(t, sb, Op{Key: "k4", Value: []byte("from b")}); err != nil {
		t.Errorf("new leader's commit: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"k1": "from a", "k4": "from b"}, dump(t, cla, prefix)); diff != "" {
		t.Errorf("etcd content (-want +got):\n%s", diff)
	}
}

// TestTakeoverWhenLeaderVanishes closes the leader's client without a
// revoke (the process died): the standby leads once the lease expires.
func TestTakeoverWhenLeaderVanishes(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("vanish")
	cla, clb := newClient(t, c), newClient(t, c)
	ta := lead(t, newElector(t, cla, prefix, "a", testTTL))
	b := newElector(t, clb, prefix, "b", testTTL)
	won := make(chan *Term, 1)
	go func() {
		tb, err := b.Campaign(context.Background())
		if err != nil {
			t.Error(err)
		}
		won <- tb
	}()
	waitCandidates(t, clb, prefix, 2)
	gone := time.Now()
	cla.Close()
	select {
	case <-ta.Done():
	case <-time.After(wait):
		t.Fatal("closing the client did not end the term")
	}
	select {
	case tb := <-won:
		if tb == nil {
			t.FailNow()
		}
		t.Cleanup(func() { tb.Resign(context.Background()) })
		t.Logf("takeover %v after the leader vanished (TTL %v)", time.Since(gone).Round(time.Millisecond), testTTL)
	case <-time.After(wait):
		t.Fatal("the standby did not take over")
	}
}

// TestPartitionedLeaderStopsFirst cuts the leader off from etcd (its
// connections stay open but carry nothing): its term must end before the
// standby can win, and the standby must win.
func TestPartitionedLeaderStopsFirst(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("partition")
	proxies := c.Proxies(t)
	var eps []string
	for _, p := range proxies {
		eps = append(eps, p.Addr)
	}
	cla, err := NewClient(context.Background(), ClientConfig{Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cla.Close() })
	clb := newClient(t, c)
	opts := ElectionOptions{TTL: 3 * time.Second, Margin: time.Second}
	a, err := NewElector(cla, prefix, "a", opts)
	if err != nil {
		t.Fatal(err)
	}
	ta := lead(t, a)
	sa := openStore(t, cla, prefix, ta, Options{})
	b, err := NewElector(clb, prefix, "b", opts)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan time.Time, 1)
	go func() {
		tb, err := b.Campaign(context.Background())
		if err != nil {
			t.Error(err)
			close(won)
			return
		}
		won <- time.Now()
		t.Cleanup(func() { tb.Resign(context.Background()) })
	}()
	waitCandidates(t, clb, prefix, 2)
	cut := time.Now()
	for _, p := range proxies {
		p.Blackhole()
	}
	var ended time.Time
	select {
	case <-ta.Done():
		ended = time.Now()
	case <-time.After(wait):
		t.Fatal("the partitioned leader's term did not end")
	}
	var wonAt time.Time
	select {
	case wonAt = <-won:
	case <-time.After(wait):
		t.Fatal("the standby did not take over")
	}
	if wonAt.IsZero() {
		t.FailNow()
	}
	t.Logf("partitioned leader stopped %v after the cut, standby led %v after the cut",
		ended.Sub(cut).Round(time.Millisecond), wonAt.Sub(cut).Round(time.Millisecond))
	if !ended.Before(wonAt) {
		t.Errorf("the standby led at %v, before the partitioned leader stopped at %v", wonAt.Sub(cut), ended.Sub(cut))
	}
	if err := commit(t, sa, Op{Key: "late", Value: []byte("x")}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("partitioned leader's Commit: %v, want ErrNotLeader", err)
	}
}

// TestCampaignCancelled checks that a standby whose campaign is cancelled
// withdraws its candidacy.
func TestCampaignCancelled(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("cancel")
	cl := newClient(t, c)
	lead(t, newElector(t, cl, prefix, "a", testTTL))
	b := newElector(t, newClient(t, c), prefix, "b", testTTL)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx)
		errc <- err
	}()
	waitCandidates(t, cl, prefix, 2)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Campaign: %v, want context.Canceled", err)
		}
	case <-time.After(wait):
		t.Fatal("cancelled Campaign did not return")
	}
	waitCandidates(t, cl, prefix, 1)
}

// TestZombieIsFenced runs a leader in a child process, freezes it with
// SIGSTOP past its lease, lets a second replica take over and then wakes
// the child up. The child keeps committing through its Store and also
// sends raw txns carrying its term's guard (as if they had passed every
// local check just before the pause): nothing it writes may land after the
// new leader's election, its Store must fail with ErrNotLeader and its
// term must end promptly.
func TestZombieIsFenced(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("zombie")
	cmd := exec.Command(os.Args[0], "-test.run=^TestZombieChild$", "-test.v")
	cmd.Env = append(os.Environ(), "ETCDSTORE_ZOMBIE="+strings.Join(c.Endpoints(), ",")+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		cmd.Process.Kill()
		<-exited
	})
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		cmd.Wait()
		close(exited)
	}()
	var log []string
	// expect returns the first line, said so far or later, that starts
	// with prefix.
	expect := func(prefix string) string {
		t.Helper()
		for _, l := range log {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		timeout := time.After(wait)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("child exited before %q; it said:\n%s", prefix, strings.Join(log, "\n"))
				}
				log = append(log, l)
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timeout:
				t.Fatalf("child did not say %q within %v; it said:\n%s", prefix, wait, strings.Join(log, "\n"))
			}
		}
	}
	expect("leading")
	expect("acked 5")
	expect("raw-ok 5")

	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cl := newClient(t, c)
	tb := lead(t, newElector(t, cl, prefix, "successor", testTTL))
	t.Logf("successor leads at revision %d", tb.Revision())
	// Give the frozen child's connections time to look idle, then wake it.
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	failed := expect("failed")
	if !strings.Contains(failed, ErrNotLeader.Error()) {
		t.Errorf("child's store failed with %q, want ErrNotLeader", failed)
	}
	expect("raw-refused")
	expect("term-ended")
	<-exited

	resp, err := cl.Get(ctxFor(t), prefix+"/state/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	keys := make(map[string]bool)
	for _, kv := range resp.Kvs {
		keys[string(kv.Key)] = true
		if kv.ModRevision >= tb.Revision() {
			t.Errorf("zombie wrote %s at revision %d, after the successor's election at %d", kv.Key, kv.ModRevision, tb.Revision())
		}
	}
	for _, l := range log {
		var n int
		if _, err := fmt.Sscanf(l, "acked %d", &n); err == nil && !keys[fmt.Sprintf("%s/state/z/%06d", prefix, n)] {
			t.Errorf("acknowledged batch %d is not in etcd", n)
		}
	}
	sb := openStore(t, cl, prefix, tb, Options{})
	if _, err := sb.Load(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := commit(t, sb, Op{Key: "after", Value: []byte("x")}); err != nil {
		t.Errorf("successor's commit: %v", err)
	}
}

// TestZombieChild is the child process of TestZombieIsFenced.
func TestZombieChild(t *testing.T) {
	spec := os.Getenv("ETCDSTORE_ZOMBIE")
	if spec == "" {
		t.Skip("run by TestZombieIsFenced")
	}
	eps, prefix, _ := strings.Cut(spec, "/")
	prefix = "/" + prefix
	cl, err := NewClient(context.Background(), ClientConfig{Endpoints: strings.Split(eps, ",")})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	term := lead(t, newElector(t, cl, prefix, "zombie", testTTL))
	s := openStore(t, cl, prefix, term, Options{})
	if _, err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	fmt.Println("leading", term.Revision())
	rawDone := make(chan struct{})
	go func() {
		defer close(rawDone)
		for i := 0; ; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := cl.Txn(ctx).If(term.Guard()).Then(clientv3.OpPut(fmt.Sprintf("%s/state/raw/%06d", prefix, i), "raw")).Commit()
			cancel()
			switch {
			case err != nil:
				fmt.Println("raw-error", i, err)
			case resp.Succeeded:
				fmt.Println("raw-ok", i)
			default:
				fmt.Println("raw-refused", i)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	for i := 0; ; i++ {
		if err := commit(t, s, Op{Key: fmt.Sprintf("z/%06d", i), Value: []byte("zombie")}); err != nil {
			fmt.Println("failed", err)
			break
		}
		fmt.Println("acked", i)
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-term.Done():
		fmt.Println("term-ended", context.Cause(term.Context()))
	case <-time.After(wait):
		fmt.Println("term-still-running")
	}
	select {
	case <-rawDone:
	case <-time.After(wait):
	}
}

// TestForeignLeaderValueIsNotEchoed (issue 17, item 6c): the election
// value a standby reads and echoes (in UNAVAILABLE answers and logs) is a
// record like any other: one no replica writes (here 64 KiB with terminal
// escapes, written by hand) is reported as unreadable, not echoed.
func TestForeignLeaderValueIsNotEchoed(t *testing.T) {
	c := sharedCluster(t)
	prefix := testPrefix("foreign")
	cl := newClient(t, c)
	e := newElector(t, cl, prefix, "replica-a 10.0.0.1:7443", testTTL)
	bogus := "\x1b[2J" + strings.Repeat("x", 64<<10)
	if _, err := cl.Put(ctxFor(t), prefix+"/election/1234", bogus); err != nil {
		t.Fatal(err)
	}
	if got, err := e.Leader(ctxFor(t)); err != nil || got != UnreadableIdentity {
		t.Errorf("Leader = %.40q, %v; want %q", got, err, UnreadableIdentity)
	}
	octx, stop := context.WithCancel(context.Background())
	defer stop()
	seen := make(chan string, 1)
	go e.Observe(octx, func(id string) {
		select {
		case seen <- id:
		default:
		}
	})
	select {
	case got := <-seen:
		if got != UnreadableIdentity {
			t.Errorf("Observe reported %.40q, want %q", got, UnreadableIdentity)
		}
	case <-time.After(wait):
		t.Fatal("Observe reported nothing")
	}
}
