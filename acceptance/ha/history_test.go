//go:build ha

package ha

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/etcdtest"
	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonhistory"
)

// TestHistoryAcrossFailover: a machine's history is kept in etcd with its
// desired state. Create and Configure on one leader, kill -9, Drain on the
// next: the new leader serves every transition once, in order, the
// Configure's guest command included, and reading the etcd prefix offline
// gives the same history.
func TestHistoryAcrossFailover(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	prefix := "/ha/history"
	s := startSet(t, c, prefix, 2, "--seed-count", "4")
	s.waitLeader(t)
	id := s.list(t, pb.MachineState_MACHINE_STATE_SPECULATIVE)[0].Id
	step := func(what string, f func(ctx context.Context, c pb.CapacityProviderClient) error, want pb.MachineState) {
		t.Helper()
		if _, err := s.call(nil, f); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for end := time.Now().Add(settleWait); s.get(t, id).State != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: machine still %v", what, s.get(t, id).State)
			}
		}
	}
	step("Create", func(ctx context.Context, c pb.CapacityProviderClient) error {
		_, err := c.Create(ctx, &pb.CreateRequest{MachineId: id})
		return err
	}, pb.MachineState_MACHINE_STATE_IDLE)
	step("Configure", func(ctx context.Context, c pb.CapacityProviderClient) error {
		_, err := c.Configure(ctx, &pb.ConfigureRequest{MachineId: id, ClusterId: "c1", BootstrapBlob: []byte("#!/bin/sh\n")})
		return err
	}, pb.MachineState_MACHINE_STATE_CONFIGURED)
	_, next, _, _ := s.killLeader(t)
	step("Drain", func(ctx context.Context, c pb.CapacityProviderClient) error {
		_, err := c.Drain(ctx, &pb.DrainRequest{MachineId: id})
		return err
	}, pb.MachineState_MACHINE_STATE_IDLE)

	read := func(args ...string) *jsonhistory.History {
		t.Helper()
		out, code := providertest.Run(t, binary, time.Minute, append([]string{"history", id, "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("provider history %v: exit %d\n%s", args, code, out)
		}
		if err := planschema.ValidateHistory([]byte(out)); err != nil {
			t.Fatalf("schema: %v\n%s", err, out)
		}
		h, err := jsonhistory.Decode([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	live := read("--server", s.reps[next].MetricsURL())
	var trans []string
	guest := 0
	for _, e := range live.Machines[0].Events {
		switch e.Kind {
		case "transition":
			trans = append(trans, e.From+">"+e.To+" "+e.Cause)
		case "guest":
			guest++
		}
	}
	want := []string{"SPECULATIVE>CREATING rpc", "CREATING>IDLE completed", "IDLE>CONFIGURING rpc",
		"CONFIGURING>CONFIGURED completed", "CONFIGURED>DRAINING rpc", "DRAINING>IDLE completed"}
	if diff := cmp.Diff(want, trans); diff != "" {
		t.Errorf("transitions after the fail-over (-want +got):\n%s", diff)
	}
	if guest != 2 { // the bootstrap hook and the drain
		t.Errorf("%d guest commands in the history, want 2:\n%+v", guest, live.Machines[0].Events)
	}
	offline := read("--use-fake-backend", "--seed-count", "4", "--state", c.URL(prefix))
	if diff := cmp.Diff(live.Machines, offline.Machines); diff != "" {
		t.Errorf("live and offline (etcd) histories differ (-live +offline):\n%s", diff)
	}
	if !strings.Contains(s.reps[next].Log(), "state loaded") {
		t.Errorf("the standby never loaded the state")
	}
}
