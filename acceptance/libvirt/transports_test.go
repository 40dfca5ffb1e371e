//go:build integration

package libvirt

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/internal/relay"
)

// remote is what scripts/libvirt-up.sh and sshd-up.sh export for the
// remote transports.
type remote struct {
	tlsDir, tlsPort, sshUser, sshKey, knownHosts string
	libsshPort, libsshConf, libsshPID, sshPort   string
}

func needRemote(t *testing.T) remote {
	t.Helper()
	r := remote{tlsDir: os.Getenv("BIGFLEET_TLS_DIR"), tlsPort: os.Getenv("BIGFLEET_TLS_PORT"),
		sshUser: os.Getenv("BIGFLEET_SSH_USER"), sshKey: os.Getenv("BIGFLEET_SSH_KEY"), knownHosts: os.Getenv("BIGFLEET_SSH_KNOWN_HOSTS"),
		libsshPort: os.Getenv("BIGFLEET_SSHD_LIBSSH_PORT"), libsshConf: os.Getenv("BIGFLEET_SSHD_LIBSSH_CONF"),
		libsshPID: os.Getenv("BIGFLEET_SSHD_LIBSSH_PID"), sshPort: os.Getenv("BIGFLEET_SSHD_SSH_PORT")}
	if r.tlsDir == "" || r.sshKey == "" || r.libsshConf == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("remote transports not configured (CI=true): run scripts/sshd-up.sh after libvirt-up.sh")
		}
		t.Skip("remote transports not configured: run scripts/sshd-up.sh after libvirt-up.sh")
	}
	return r
}

// stopSSHD stops an sshd and the sessions it forked, by PID.
func stopSSHD(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("sshd pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	victims := []int{pid}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(st)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			victims = append(victims, p)
		}
	}
	for _, p := range victims {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	for i := 0; alive(pid); i++ {
		if i > 100 {
			t.Fatalf("sshd %d did not exit", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSSHD(t *testing.T, conf string) {
	t.Helper()
	if out, err := exec.Command("/usr/sbin/sshd", "-f", conf, "-E", strings.TrimSuffix(conf, ".conf")+".log").CombinedOutput(); err != nil {
		t.Errorf("sshd -f %s: %v %s", conf, err, out)
	}
}

// One provider, one zone per transport (unix socket, qemu+tls through a
// relay, qemu+libssh and qemu+ssh through their own sshd), all on this
// machine's libvirtd. Each transport in turn is stopped (the TLS path cut,
// the libssh sshd and its sessions killed) while a Configure waits in its
// zone; the other zones keep creating, configuring and deleting; when the
// transport comes back, the waiting Configure completes.
//
// Not parallel: four TCG guests already fill two cores.
func TestTransportsUnderLoad(t *testing.T) {
	r := needRemote(t)
	rl, err := relay.New("127.0.0.1:" + r.tlsPort)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	t.Cleanup(func() {
		if b, err := os.ReadFile(r.libsshPID); err != nil || !alive(atoi(string(b))) {
			startSSHD(t, r.libsshConf)
		}
	})
	uris := map[string]string{
		"local":  sub.URI,
		"tls":    "qemu+tls://127.0.0.1:" + rl.Port() + "/system?pkipath=" + filepath.Join(r.tlsDir, "client"),
		"libssh": fmt.Sprintf("qemu+libssh://%s@127.0.0.1:%s/system?keyfile=%s&known_hosts=%s&known_hosts_verify=normal", r.sshUser, r.libsshPort, r.sshKey, r.knownHosts),
		"ssh":    fmt.Sprintf("qemu+ssh://%s@127.0.0.1:%s/system?keyfile=%s", r.sshUser, r.sshPort, r.sshKey),
	}
	zones := []string{"libssh", "local", "ssh", "tls"}
	var connect, pools []string
	var offs []offering
	for _, z := range zones {
		connect = append(connect, z+"="+uris[z])
		pools = append(pools, z+"="+sub.Pool)
		offs = append(offs, offering{InstanceType: "tiny.1", Zone: z, Count: 2})
	}
	p := startProvider(t, config{connect: strings.Join(connect, ","), pools: strings.Join(pools, ","), offerings: offs,
		extra: []string{"--configure-timeout", "10m", "--create-timeout", "10m"}})
	for _, z := range zones {
		p.waitZone(z, true, 30*time.Second)
	}
	id := func(z string, n int) string { return fmt.Sprintf("%s/tiny.1/%03d", z, n) }
	t0 := time.Now()
	for _, z := range zones {
		p.create(id(z, 0))
	}
	for _, z := range zones {
		p.waitState(id(z, 0), providertest.StIdle, 6*time.Minute)
	}
	t.Logf("MEASURE 4 Creates, one per transport, -> all IDLE: %s", time.Since(t0).Round(time.Millisecond))

	outage := func(down string, stop, start func()) {
		t.Helper()
		stop()
		cut := time.Now()
		line := p.waitZone(down, false, 10*time.Second)
		t.Logf("MEASURE %s stopped -> /readyz down in %s: %q", down, time.Since(cut).Round(time.Millisecond), line)
		// Work waits in the stopped zone, never fails for it.
		p.configure(id(down, 0), "during-"+down+"-outage", []byte("blob"))
		// The other zones keep creating, configuring and deleting.
		w0 := time.Now()
		for _, z := range zones {
			if z == down {
				continue
			}
			p.create(id(z, 1))
			p.configure(id(z, 0), "cluster-"+z, []byte("blob"))
		}
		for _, z := range zones {
			if z == down {
				continue
			}
			p.waitState(id(z, 1), providertest.StIdle, 6*time.Minute)
			p.waitState(id(z, 0), providertest.StConfigured, 6*time.Minute)
			p.delete(id(z, 1))
		}
		for _, z := range zones {
			if z != down {
				p.waitState(id(z, 1), providertest.StSpeculative, 6*time.Minute)
			}
		}
		t.Logf("MEASURE with %s down, the other 3 zones created, configured and deleted in %s", down, time.Since(w0).Round(time.Millisecond))
		if st := p.get(id(down, 0)).GetState(); st != pb.MachineState_MACHINE_STATE_CONFIGURING {
			t.Errorf("machine in the stopped zone %s is %s, want CONFIGURING (waiting)", down, st)
		}
		start()
		back := time.Now()
		p.waitZone(down, true, 30*time.Second)
		t.Logf("MEASURE %s restored -> /readyz ok in %s", down, time.Since(back).Round(time.Millisecond))
		p.waitState(id(down, 0), providertest.StConfigured, 6*time.Minute)
		t.Logf("MEASURE %s restored -> waiting Configure CONFIGURED in %s", down, time.Since(back).Round(time.Millisecond))
		// Reset for the next outage: back to IDLE through a drain.
		for _, z := range zones {
			dom := strings.TrimPrefix(p.get(id(z, 0)).GetHost().GetRef(), z+"/")
			if err := writeGuestFile(dom, "/usr/bin/kubectl", []byte(fakeKubectl), "0755"); err != nil {
				t.Fatalf("install fake kubectl in %s: %v", dom, err)
			}
			p.drain(id(z, 0), 0)
		}
		for _, z := range zones {
			p.waitState(id(z, 0), providertest.StIdle, 3*time.Minute)
		}
	}
	outage("tls", rl.Cut, func() {
		if err := rl.Restore(); err != nil {
			t.Fatal(err)
		}
	})
	outage("libssh", func() { stopSSHD(t, r.libsshPID) }, func() { startSSHD(t, r.libsshConf) })

	for _, z := range zones {
		p.delete(id(z, 0))
	}
	for _, z := range zones {
		p.waitState(id(z, 0), providertest.StSpeculative, 6*time.Minute)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
