package providertest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

func TestMetric(t *testing.T) {
	body := `# HELP bigfleet_provider_hypervisor_calls_total Calls.
# TYPE bigfleet_provider_hypervisor_calls_total counter
bigfleet_provider_hypervisor_calls_total{op="clone_vm",outcome="ok",zone="a"} 2
bigfleet_provider_hypervisor_calls_total{op="clone_vm",outcome="error",zone="a"} 1
bigfleet_provider_hypervisor_calls_total{op="define_domain",outcome="ok",zone="b"} 4
bigfleet_provider_hypervisor_calls_total_extra{op="clone_vm"} 100
bigfleet_provider_up 1
`
	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"bigfleet_provider_hypervisor_calls_total", nil, 7},
		{"bigfleet_provider_hypervisor_calls_total", []string{`op="clone_vm"`}, 3},
		{"bigfleet_provider_hypervisor_calls_total", []string{`op="clone_vm"`, `outcome="ok"`}, 2},
		{"bigfleet_provider_hypervisor_calls_total", []string{`op="delete_vm"`}, 0},
		{"bigfleet_provider_up", nil, 1},
		{"bigfleet_provider_absent", nil, 0},
	}
	for _, tt := range tests {
		if got := Metric(body, tt.name, tt.labels...); got != tt.want {
			t.Errorf("Metric(%s, %v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
}

// fatalTB records the first Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func run(fn func(tb testing.TB)) string {
	f := &fatalTB{}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.msg
}

// WaitFor returns the machine once it is in the state wanted, fails at
// once on FAILED (unless wanted), and fails when max passes: no wait is
// unbounded.
func TestWaitFor(t *testing.T) {
	seq := func(states ...pb.MachineState) func() *pb.Machine {
		i := 0
		return func() *pb.Machine {
			s := states[min(i, len(states)-1)]
			i++
			return &pb.Machine{Id: "m", State: s, LastError: "boom"}
		}
	}
	tests := []struct {
		name    string
		get     func() *pb.Machine
		want    pb.MachineState
		wantMsg string // "" : returns the machine
	}{
		{"reached", seq(StCreating, StCreating, StIdle), StIdle, ""},
		{"failed is fatal", seq(StCreating, StFailed), StIdle, `went FAILED while waiting for MACHINE_STATE_IDLE: last_error "boom"`},
		{"failed when wanted", seq(StCreating, StFailed), StFailed, ""},
		{"bounded", seq(StCreating), StIdle, "still MACHINE_STATE_CREATING after 50ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got *pb.Machine
			msg := run(func(tb testing.TB) { got = WaitFor(tb, tt.get, "m", tt.want, 50*time.Millisecond) })
			switch {
			case tt.wantMsg == "" && (msg != "" || got.GetState() != tt.want):
				t.Errorf("WaitFor = %v, fatal %q; want the machine in %v", got.GetState(), msg, tt.want)
			case tt.wantMsg != "" && !strings.Contains(msg, tt.wantMsg):
				t.Errorf("WaitFor fatal %q, want it to contain %q", msg, tt.wantMsg)
			}
		})
	}
}

// FreeAddrs never hands out one port twice in a call (two FreeAddr calls
// can: a launch once got --addr and --metrics-addr on one port).
func TestFreeAddrsAreDistinct(t *testing.T) {
	for range 200 {
		a := FreeAddrs(t, 2)
		if len(a) != 2 || a[0] == a[1] {
			t.Fatalf("FreeAddrs(2) = %v", a)
		}
	}
}
