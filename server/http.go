package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/fake"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/planner"
)

// httpHandler serves /metrics, /healthz, /readyz, /debug/plan and, on the
// simulator only, the /admin/ drift endpoints.
func (p *Provider) httpHandler(serving *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(p.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		var problems []string
		if !serving.Load() {
			problems = append(problems, "gRPC is not serving")
		}
		if err := p.Doc.Healthy(); err != nil {
			problems = append(problems, "state store: "+err.Error())
		}
		var detail []string
		if h, ok := p.HV.(hypervisors.HealthReporter); ok {
			zh := h.ZoneHealth()
			zones := make([]string, 0, len(zh))
			for z := range zh {
				zones = append(zones, z)
			}
			sort.Strings(zones)
			for _, z := range zones {
				if err := zh[z]; err != nil {
					detail = append(detail, "zone "+z+": "+err.Error())
				} else {
					detail = append(detail, "zone "+z+": ok")
				}
			}
		}
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready")
			for _, s := range problems {
				fmt.Fprintln(w, s)
			}
		} else {
			fmt.Fprintln(w, "ready")
		}
		for _, s := range detail {
			fmt.Fprintln(w, s)
		}
	})
	mux.HandleFunc("/debug/plan", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
		defer cancel()
		// The one encoder of the JSON plan, as `provider plan --json`.
		body, err := planner.MarshalJSON(p.Rec.Plan(ctx))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	if sim, ok := p.raw.(simulator); ok {
		mux.HandleFunc("/admin/", p.admin(sim))
	}
	return mux
}

// simulator is what the admin endpoints drive; both fake shapes have it.
type simulator interface {
	StopVM(hypervisors.Target) error
	PauseVM(hypervisors.Target) error
	ResizeVM(hypervisors.Target, int, int) error
	RemoveVM(hypervisors.Target) error
	SetUnreachable(zone string, on bool)
}

// admin serves POST /admin/{stop,pause,resize,delete,add-foreign,unreachable}.
// VMs are named by zone plus name (libvirt) or vmid (Proxmox).
func (p *Provider) admin(sim simulator) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		t := hypervisors.Target{Zone: q.Get("zone"), Name: q.Get("name")}
		if v := q.Get("vmid"); v != "" {
			t.VMID, _ = strconv.Atoi(v)
		}
		if m := q.Get("machine"); m != "" {
			if mm := p.Doc.Get(m); mm != nil {
				t = hypervisors.Target{Zone: mm.Zone, Name: mm.VMName, VMID: mm.VMID}
			} else {
				http.Error(w, "unknown machine "+m, http.StatusNotFound)
				return
			}
		}
		var err error
		switch action := strings.TrimPrefix(r.URL.Path, "/admin/"); action {
		case "stop":
			err = sim.StopVM(t)
		case "pause":
			err = sim.PauseVM(t)
		case "resize":
			vcpu, _ := strconv.Atoi(q.Get("vcpu"))
			mem, _ := strconv.Atoi(q.Get("memory_mib"))
			err = sim.ResizeVM(t, vcpu, mem)
		case "delete":
			err = sim.RemoveVM(t)
		case "add-foreign":
			switch f := p.raw.(type) {
			case *fake.Libvirt:
				err = f.AddForeignVM(t.Zone, t.Name, nil)
			case *fake.Proxmox:
				_, err = f.AddForeignVM(t.Zone, t.VMID, t.Name, nil)
			}
		case "add-owned":
			mk := observed.Marker{Installation: p.Doc.Installation(), MachineID: q.Get("id"), InstanceType: q.Get("instance_type")}
			switch f := p.raw.(type) {
			case *fake.Libvirt:
				err = f.AddOwnedVM(t.Zone, t.Name, mk, observed.PowerRunning)
			case *fake.Proxmox:
				_, err = f.AddOwnedVM(t.Zone, t.Name, mk, observed.PowerRunning)
			}
		case "unreachable":
			sim.SetUnreachable(t.Zone, q.Get("on") != "false")
		default:
			http.Error(w, "unknown admin action "+action, http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.Rec.Trigger()
		fmt.Fprintln(w, "ok")
	}
}

// FetchPlan gets the plan of a running provider from its metrics
// listener's /debug/plan (base is e.g. http://127.0.0.1:9090). It returns
// the decoded plan and the JSON exactly as served, which Decode has
// checked is a plan this build can read.
func FetchPlan(ctx context.Context, base string) (*jsonplan.Plan, []byte, error) {
	url := strings.TrimRight(base, "/") + "/debug/plan"
	if !strings.Contains(base, "://") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan from %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan from %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("fetch plan from %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	p, err := jsonplan.Decode(body)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan from %s: %w", url, err)
	}
	return p, body, nil
}
