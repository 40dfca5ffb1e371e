//go:build ha

package ha

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/etcdtest"
)

// Load shape of the fail-over tests: small enough for two cores with the
// race detector, busy enough that transitions are in flight at every kill.
const (
	loadMachines = 48
	loadWalkers  = 8
	loadPoll     = 25 * time.Millisecond
	// fakeLatency makes every simulated hypervisor call take a while, so a
	// kill lands in the middle of transitions.
	fakeLatency = "30ms"
	// progressPerRound is how many transitions complete between kills.
	progressPerRound = 24
)

// TestFailoverUnderLoad kills the leader (-9) again and again while
// walkers that follow the leader take machines through every transition,
// restarting each killed replica as the new standby. The standby must
// take over each time; afterwards no acknowledged mutation is lost,
// operation ids never repeated, fence marks hold, no machine has two VMs
// and none stays transitional. Takeover times (kill to the standby
// reporting SERVING, and kill to the first acknowledged mutation) are
// logged as distributions.
func TestFailoverUnderLoad(t *testing.T) {
	for _, sh := range []struct {
		name  string
		args  []string
		kills int
	}{
		{"libvirt", nil, 5},
		{"proxmox", []string{"--hypervisor", "proxmox"}, 3},
	} {
		t.Run(sh.name, func(t *testing.T) {
			c := etcdtest.Start(t, etcdtest.Options{})
			args := append([]string{"--seed-count", strconv.Itoa(loadMachines), "--fake-latency", fakeLatency}, sh.args...)
			s := startSet(t, c, "/ha/failover-"+sh.name, 2, args...)
			s.waitLeader(t)
			ld := startLoad(t, s, loadWalkers, loadPoll)

			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
			var serving, firstAck []time.Duration
			for range sh.kills {
				// A random amount of work between kills, so they land on
				// every kind of transition.
				ld.waitProgress(t, progressPerRound+rng.Int64N(progressPerRound))
				old, next, t0, took := s.killLeader(t)
				serving = append(serving, took)
				firstAck = append(firstAck, ld.waitAckAfter(t, t0).Sub(t0))
				// The killed replica comes back as the standby.
				s.reps[old].Launch()
				if sv := s.serving(); len(sv) != 1 || sv[0] != next {
					t.Fatalf("after the restart of replica %d, replicas %v serve; want only %d", old, sv, next)
				}
			}
			ld.waitProgress(t, progressPerRound)
			verify(t, s, ld, loadMachines)
			t.Logf("takeover with the default 5s lease, kill -9 -> standby SERVING: %s", dist(serving))
			t.Logf("takeover with the default 5s lease, kill -9 -> first acknowledged mutation: %s", dist(firstAck))
		})
	}
}
