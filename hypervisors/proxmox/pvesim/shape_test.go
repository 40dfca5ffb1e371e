package pvesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The JSON types the shape comparison tells apart. Numbers are split into
// integers and floats because go-proxmox decodes most counters into
// uint64, which a float breaks; an integer where PVE sends floats is fine.
// Strings starting with "UPID:" are UPIDs and must have PVE's form.
const (
	kString  = "string"
	kUPID    = "upid"
	kBadUPID = "malformed-upid"
	kInt     = "integer"
	kFloat   = "float"
	kBool    = "bool"
	kNull    = "null"
	kObject  = "object"
	kArray   = "array"
)

// upidForm is a UPID as PVE's PVE::Tools::upid_encode writes it: node,
// pid, pstart and starttime (8 upper-case hex digits each), type, id,
// user, and a trailing colon.
var upidForm = regexp.MustCompile(`^UPID:[^:]+:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:[^:]+:[^:]*:[^:]+:$`)

func kindOf(v any) string {
	switch x := v.(type) {
	case nil:
		return kNull
	case bool:
		return kBool
	case json.Number:
		if strings.ContainsAny(x.String(), ".eE") {
			return kFloat
		}
		return kInt
	case string:
		if strings.HasPrefix(x, "UPID:") {
			if upidForm.MatchString(x) {
				return kUPID
			}
			return kBadUPID
		}
		return kString
	case map[string]any:
		return kObject
	case []any:
		return kArray
	}
	return fmt.Sprintf("%T", v)
}

// shape is the flattened JSON shape of one or more answers. Paths look
// like "data.memory.total"; array elements are "path[]", or "path[qemu]"
// when the elements are objects with a string "type" (PVE's mixed lists:
// /cluster/resources, /cluster/status), so each resource type is compared
// with its own kind. Members of objects keyed by data (ACL paths,
// privilege names, drive names) collapse into "path.*".
type shape struct {
	kinds   map[string]map[string]bool
	objects map[string]int    // object path -> objects seen there
	members map[string]int    // member path -> parent objects that had it
	parent  map[string]string // member or element path -> parent path
	elems   map[string]int    // array path -> elements seen
	mapKeys map[string]bool   // member paths under a data-keyed object
}

func newShape() *shape {
	return &shape{kinds: map[string]map[string]bool{}, objects: map[string]int{}, members: map[string]int{},
		parent: map[string]string{}, elems: map[string]int{}, mapKeys: map[string]bool{}}
}

func (s *shape) add(v any, path string, maps map[string]bool) {
	if s.kinds[path] == nil {
		s.kinds[path] = map[string]bool{}
	}
	s.kinds[path][kindOf(v)] = true
	switch x := v.(type) {
	case map[string]any:
		s.objects[path]++
		for k, mv := range x {
			child := k
			if path != "" {
				child = path + "." + k
			}
			if maps[path] {
				child = path + ".*"
				s.mapKeys[child] = true
			}
			s.members[child]++
			s.parent[child] = path
			s.add(mv, child, maps)
		}
	case []any:
		s.elems[path] += len(x)
		for _, e := range x {
			g := ""
			if m, ok := e.(map[string]any); ok {
				if t, ok := m["type"].(string); ok {
					g = t
				}
			}
			child := path + "[" + g + "]"
			s.parent[child] = path
			s.add(e, child, maps)
		}
	}
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// difference is one way pvesim's answer departs from the recordings.
type difference struct {
	Kind string // extra | missing | type
	Path string
	Note string // for type: "pvesim integer, recorded string"
}

func (d difference) String() string {
	if d.Note == "" {
		return d.Kind + " " + d.Path
	}
	return d.Kind + " " + d.Path + ": " + d.Note
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compareShapes lists the differences of sim from rec:
//   - extra: a path pvesim sends that no recording has (reported at the
//     outermost such path only);
//   - type: a JSON type pvesim sends at a path where the recordings have
//     other types (an integer where they have floats is accepted);
//   - missing: a member every recorded object at that path has but some
//     pvesim object lacks, or a kind of array element (a resource type)
//     the recordings have and a non-empty pvesim array lacks.
func compareShapes(sim, rec *shape) []difference {
	var out []difference
	paths := make([]string, 0, len(sim.kinds))
	for p := range sim.kinds {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		rk, ok := rec.kinds[p]
		if !ok {
			if _, parentKnown := rec.kinds[sim.parent[p]]; parentKnown || sim.parent[p] == "" {
				out = append(out, difference{Kind: "extra", Path: p, Note: strings.Join(sortedKeys(sim.kinds[p]), "|")})
			}
			continue
		}
		for _, k := range sortedKeys(sim.kinds[p]) {
			if rk[k] || (k == kInt && rk[kFloat]) {
				continue
			}
			out = append(out, difference{Kind: "type", Path: p,
				Note: fmt.Sprintf("pvesim %s, recorded %s", k, strings.Join(sortedKeys(rk), "|"))})
		}
	}
	var recPaths []string
	for p := range rec.parent {
		recPaths = append(recPaths, p)
	}
	sort.Strings(recPaths)
	for _, p := range recPaths {
		par := rec.parent[p]
		if _, isMember := rec.members[p]; isMember {
			if rec.mapKeys[p] || rec.members[p] < rec.objects[par] {
				continue // optional in the recordings
			}
			if n := sim.objects[par]; n > 0 && sim.members[p] < n {
				out = append(out, difference{Kind: "missing", Path: p})
			}
			continue
		}
		if sim.elems[par] > 0 && sim.kinds[p] == nil {
			out = append(out, difference{Kind: "missing", Path: p})
		}
	}
	return out
}

// deviation is a deliberate, explained difference between pvesim and the
// recordings: the listed differences (difference.String()) are accepted
// on the listed endpoints (shapeCase.name) for the listed PVE majors.
// Every listed difference must still occur somewhere; a stale entry fails
// the test.
type deviation struct {
	endpoints []string
	majors    []string // nil: every version
	diffs     []string
	why       string
}

// Endpoint groups the deviations refer to.
var (
	statusCurrent = []string{"GET status/current (running)", "GET status/current (stopped)", "GET status/current (template)"}
	configGets    = []string{"GET config", "GET config (template)"}
)

// deviations is the allowlist. An entry is one of:
//   - a key pvesim leaves out because it models no such thing (storage in
//     pools, balloon settings, SPICE, CD-ROM drives);
//   - a key real PVE sends only in a situation the recorded objects are not
//     in (a guest in a pool, a tagged guest, a template, a stopped VM), with
//     the PVE source that sends it;
//   - a hand-written go-proxmox fixture that contradicts PVE's source; then
//     pvesim follows PVE, and the entry cites where.
var deviations = []deviation{
	{endpoints: []string{"GET /cluster/resources", "GET /cluster/resources?type=vm"},
		diffs: []string{"extra data[qemu].pool: string"},
		why: "PVE adds \"pool\" to a guest's entry when the guest is in a pool (pve-manager " +
			"PVE::API2::Cluster resources; go-proxmox ClusterResource.Pool); no recorded guest is in a pool."},
	{endpoints: []string{"GET /nodes/{node}/status"}, majors: []string{"8", "9"},
		diffs: []string{"extra data.cpuinfo.flags: string", "extra data.cpuinfo.hvm: string",
			"extra data.cpuinfo.mhz: string", "extra data.cpuinfo.user_hz: integer", "extra data.idle: integer",
			"extra data.ksm: object", "extra data.rootfs: object", "extra data.swap: object", "extra data.wait: integer"},
		why: "The pve8x/pve9x node status fixtures are trimmed by hand; the pve7x capture of a real PVE 7.4 " +
			"node has every one of these keys with these types, and the PVE7 case holds pvesim to it " +
			"without deviations. go-proxmox's Node decodes them."},
	{endpoints: []string{"GET /pools", "GET /pools?poolid="},
		diffs: []string{"missing data[].comment"},
		why:   "PVE returns a pool's comment only when it has one (optional in the /pools schema); pvesim pools have none."},
	{endpoints: []string{"GET /pools?poolid="},
		diffs: []string{"extra data[].members[qemu].tags: string"},
		why: "Pool members are the guests' resource entries, which carry \"tags\" when the guest has tags " +
			"(see the tagged guest in the /cluster/resources recording); the recorded members have none."},
	{endpoints: []string{"GET /pools?poolid="},
		diffs: []string{"missing data[].members[storage]"},
		why:   "pvesim pools hold guests only; the adapter reads pool membership of VMs."},
	{endpoints: append(append([]string{}, statusCurrent...), "GET /nodes/{node}/qemu"),
		diffs: []string{"extra data.tags: string", "extra data[].tags: string"},
		why: "qemu-server's vmstatus() copies tags from the config when set (PVE/QemuServer.pm: " +
			"$d->{tags} = $conf->{tags} if defined); the recorded status objects are of untagged VMs."},
	{endpoints: []string{"GET status/current (template)", "GET /nodes/{node}/qemu"},
		diffs: []string{"extra data.template: integer", "extra data[].template: integer"},
		why: "vmstatus() sets template => 1 for templates only (so go-proxmox's IsTemplate, true for any " +
			"value, works); no recorded VM is a template."},
	{endpoints: statusCurrent, majors: []string{"8"},
		diffs: []string{"missing data.balloon_min", "missing data.shares", "missing data.spice"},
		why: "vmstatus() sets balloon_min and shares only when the config sets balloon, vm_status sets " +
			"spice only for a SPICE-capable vga; pvesim VMs configure neither. (The PVE 9 fixtures " +
			"already show them as optional.)"},
	{endpoints: []string{"GET status/current (stopped)", "GET status/current (template)"}, majors: []string{"8"},
		diffs: []string{"missing data.pid", "missing data.balloon", "missing data.ballooninfo", "missing data.blockstat",
			"missing data.freemem", "missing data.nics", "missing data.proxmox-support",
			"missing data.running-machine", "missing data.running-qemu"},
		why: "The only PVE 8 status recording is of a running VM. vmstatus() sets pid only for a running " +
			"VM and queries QMP (balloon, blockstat, nics, running-*, proxmox-support) only for VMs with a pid."},
	{endpoints: []string{"GET /nodes/{node}/qemu"}, majors: []string{"8"},
		diffs: []string{"missing data[].agent", "missing data[].ha", "missing data[].qmpstatus", "missing data[].pid",
			"missing data[].balloon", "missing data[].balloon_min", "missing data[].ballooninfo",
			"missing data[].blockstat", "missing data[].freemem", "missing data[].nics",
			"missing data[].proxmox-support", "missing data[].running-machine", "missing data[].running-qemu",
			"missing data[].shares", "missing data[].spice"},
		why: "No recording lists /nodes/{node}/qemu; it is held against status/current. The list is " +
			"vmstatus(undef, full=0) (qemu-server PVE/API2/Qemu.pm vmlist): no QMP keys (qmpstatus is " +
			"set only with full), no ha/agent/spice (added by vm_status only), pid only while running."},
	{endpoints: configGets,
		diffs: []string{"missing data.vmid"},
		why: "vm_config returns the parsed config file, whose schema (json_config_properties plus digest) " +
			"has no vmid: the VMID is in the path. The fixtures add it by hand."},
	{endpoints: configGets,
		diffs: []string{"type data.memory: pvesim string, recorded integer"},
		why: "In PVE 8 and 9 memory is a property string (\"[current=]<MiB>\", read by get_current_memory " +
			"in PVE/QemuServer/Memory.pm), so the config answer carries a JSON string, as real 8.x answers " +
			"quoted in Telmate/proxmox-api-go#413 and Telmate/terraform-provider-proxmox#1209 show; the " +
			"fixtures' number is the PVE 7 form. go-proxmox decodes both; pvesim sends the string so the " +
			"adapter is tested against what PVE 8 and 9 send."},
	{endpoints: configGets,
		diffs: []string{"extra data.agent: string", "extra data.description: string", "extra data.onboot: integer",
			"extra data.smbios1: string", "extra data.vmgenid: string", "extra data.template: integer"},
		why: "The config answer has exactly the keys set in the VM's config file; the recorded VMs set none " +
			"of these. Types follow json_config_properties: agent, description, smbios1, vmgenid are " +
			"strings, onboot and template booleans (sent as 1)."},
	{endpoints: configGets, majors: []string{"8"},
		diffs: []string{"missing data.ide2"},
		why:   "pvesim VMs have no CD-ROM drive; drive keys exist only when configured."},
	{endpoints: []string{"POST clone"},
		diffs: []string{"type data: pvesim upid, recorded null"},
		why: "clone_vm returns the worker's UPID (qemu-server PVE/API2/Qemu.pm: returns type string, " +
			"fork_worker('qmclone', ...)); go-proxmox's Clone turns null into a nil task whose Wait " +
			"dereferences nil. The fixture's null is not what PVE sends."},
	{endpoints: []string{"GET agent/exec-status (exited, stdout)", "GET agent/exec-status (exited, stderr)"},
		diffs: []string{"type data.out-truncated: pvesim integer, recorded bool"},
		why: "qemu-server turns every JSON boolean of QGA's answer into 1/0 (PVE/QemuServer/Agent.pm " +
			"qemu_exec_status), so PVE sends \"out-truncated\": 0 or 1; the fixture's false cannot come " +
			"from PVE. (go-proxmox decodes out-truncated as IntOrBool, err-truncated as bool, which breaks " +
			"on PVE's 0; the adapter decodes exec-status itself for that reason.)"},
	{endpoints: []string{"GET agent/exec-status (exited, stderr)"},
		diffs: []string{"extra data.err-data: string", "extra data.err-truncated: integer", "missing data.out-data",
			"missing data.out-truncated"},
		why: "QGA returns out-data/err-data only for streams that produced output, and a current qemu-ga " +
			"the stream's truncation flag with it (upstream commit 28c5d27dd4; Debian 12's qemu-ga " +
			"1:7.2+dfsg-7+deb12u18 answered {exitcode, exited, out-data, out-truncated: false, err-data, " +
			"err-truncated: false} when probed); the recorded command wrote stdout only."},
	{endpoints: []string{"GET agent/exec-status (killed)"},
		diffs: []string{"extra data.signal: integer", "missing data.exitcode", "missing data.out-data",
			"missing data.out-truncated"},
		why: "QGA reports signal instead of exitcode for a process killed by a signal (Debian 12's " +
			"qemu-ga answered {signal: 9, exited: true} when probed), and no out-data for a process " +
			"that printed nothing; the recorded command exited normally with output."},
}

type simResp struct {
	code int
	body []byte
}

// shapeEnv is one simulator with fixtures covering the optional keys
// pvesim can send (tags, pool, description, templates, running VMs,
// finished, failed and running tasks).
type shapeEnv struct {
	t   *testing.T
	s   *Server
	srv *httptest.Server
}

func newShapeEnv(t *testing.T, version string) *shapeEnv {
	t.Helper()
	lat := ZeroLatency()
	lat.Task[KindShutdown] = time.Hour // a task that stays running
	s := New(Options{Nodes: []string{"pve1", "pve2"}, Version: version, Latencies: lat})
	s.AddToken(Token{ID: "shape@pve!t", Secret: "sec", ACL: FullAccess()})
	s.AddToken(Token{ID: "audit@pve!none", Secret: "sec", ACL: map[string][]string{"/": {"Sys.Audit"}}})
	s.AddPool("fleet")
	specs := []VMSpec{
		{VMID: 9000, Node: "pve1", Name: "tmpl", Template: true, Tags: []string{"golden"}},
		{VMID: 100, Node: "pve1", Name: "web", Running: true, Tags: []string{"bigfleet", "env-ci"}, Pool: "fleet",
			Description: "bigfleet: marker", OnBoot: true, Cores: 2, MemoryMiB: 2048},
		{VMID: 101, Node: "pve1", Name: "stopped"},
		{VMID: 102, Node: "pve2", Name: "slow", Running: true},
		{VMID: 103, Node: "pve1", Name: "doomed"},
		{VMID: 104, Node: "pve1", Name: "failing", Running: true},
		{VMID: 105, Node: "pve1", Name: "paused", Running: true},
	}
	for _, sp := range specs {
		if err := s.AddVM(sp); err != nil {
			t.Fatal(err)
		}
	}
	srv := s.NewTLSServer()
	t.Cleanup(func() { srv.Close(); s.Close() })
	return &shapeEnv{t: t, s: s, srv: srv}
}

// do sends one request as go-proxmox would (JSON body, API token).
func (e *shapeEnv) do(method, path, body string) simResp {
	e.t.Helper()
	return e.doAs("PVEAPIToken=shape@pve!t=sec", method, path, body)
}

// doAs sends one request with the given Authorization header. While a
// previous case's task still holds the VM's config lock, it retries, as
// PVE itself waits for the lock.
func (e *shapeEnv) doAs(auth, method, path, body string) simResp {
	e.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, e.srv.URL+apiPrefix+path, rd)
		if err != nil {
			e.t.Fatal(err)
		}
		req.Header.Set("Authorization", auth)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := e.srv.Client().Do(req)
		if err != nil {
			e.t.Fatalf("%s %s: %v", method, path, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			e.t.Fatalf("%s %s: %v", method, path, err)
		}
		if res.StatusCode == 500 && strings.Contains(res.Status, "can't lock file") && time.Now().Before(deadline) {
			continue
		}
		return simResp{code: res.StatusCode, body: b}
	}
}

// upid sends a request that must start a task and returns its UPID.
func (e *shapeEnv) upid(method, path, body string) string {
	e.t.Helper()
	r := e.do(method, path, body)
	var v struct{ Data string }
	if err := json.Unmarshal(r.body, &v); err != nil || r.code != 200 || !strings.HasPrefix(v.Data, "UPID:") {
		e.t.Fatalf("%s %s: %d %s, want a UPID", method, path, r.code, r.body)
	}
	return v.Data
}

// execPID starts a command in VM 102's guest and returns its pid.
func (e *shapeEnv) execPID(body string) int {
	e.t.Helper()
	r := e.do("POST", "/nodes/pve2/qemu/102/agent/exec", body)
	var v struct{ Data struct{ PID int } }
	if err := json.Unmarshal(r.body, &v); err != nil || v.Data.PID == 0 {
		e.t.Fatalf("exec: %d %s", r.code, r.body)
	}
	return v.Data.PID
}

// finished waits until the task is stopped and returns its UPID.
func (e *shapeEnv) finished(upid string) string {
	e.t.Helper()
	node := strings.Split(upid, ":")[1]
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		r := e.do("GET", "/nodes/"+node+"/tasks/"+upid+"/status", "")
		var v struct{ Data struct{ Status string } }
		if err := json.Unmarshal(r.body, &v); err == nil && v.Data.Status == "stopped" {
			return upid
		}
	}
	e.t.Fatalf("task %s did not finish", upid)
	return ""
}

// shapeCase is one endpoint pvesim serves, the request that exercises it,
// and the recordings it is held against.
type shapeCase struct {
	name string
	req  func(e *shapeEnv) (method, path, body string)
	// rec names the recordings per PVE major (mock file in a comment); a
	// major without an entry has no recording for this endpoint.
	rec map[string][]string
	// recView, if set, maps a recorded answer to the part that applies
	// (say, the qemu entries of an unfiltered /cluster/resources).
	recView func(any) any
	// maps are the paths whose members are keyed by data.
	maps []string
	// derived, if set, says why recordings of another endpoint or
	// situation apply to this one (no recording of it exists).
	derived string
	// code, if set, is the expected status when it differs from the
	// recording's (an error answer held against the recorded 500 body).
	code int
	// token, if set, replaces the request's Authorization header.
	token string
}

// keepTypes keeps the elements of data whose "type" is one of types.
func keepTypes(types ...string) func(any) any {
	return func(v any) any {
		m := v.(map[string]any)
		var kept []any
		for _, e := range m["data"].([]any) {
			if t, _ := e.(map[string]any)["type"].(string); contains(types, t) {
				kept = append(kept, e)
			}
		}
		return map[string]any{"data": kept}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// asList wraps a recorded object answer into a one-element list answer.
func asList(v any) any {
	return map[string]any{"data": []any{v.(map[string]any)["data"]}}
}

func fixed(method, path, body string) func(*shapeEnv) (string, string, string) {
	return func(*shapeEnv) (string, string, string) { return method, path, body }
}

func both(keys ...string) map[string][]string { return map[string][]string{"8": keys, "9": keys} }

// taskRecs are the recorded task answers (tasks.go in pve8x and pve9x).
const (
	recTaskRunning   = "UPID:node1:00000001:00000001:00000001:test:running:root@pam:"
	recTaskCompleted = "UPID:node1:00000002:00000002:00000002:test:completed:root@pam:"
	recTaskFailed    = "UPID:node1:00000003:00000003:00000003:test:failed:root@pam:"
)

// shapeCases lists every endpoint pvesim serves (see route in http.go).
// Endpoints with no recording in either version are listed in
// unverifiedEndpoints instead.
var shapeCases = []shapeCase{
	{name: "GET /version", req: fixed("GET", "/version", ""),
		rec: both("GET ^/version$")}, // version.go
	{name: "GET /cluster/status", req: fixed("GET", "/cluster/status", ""),
		rec: both("GET /cluster/status")}, // cluster.go
	{name: "GET /cluster/resources", req: fixed("GET", "/cluster/resources", ""),
		rec: both("GET ^/cluster/resources$")}, // cluster.go
	{name: "GET /cluster/resources?type=node", req: fixed("GET", "/cluster/resources?type=node", ""),
		rec: both("GET ^/cluster/resources$?type=node", "GET ^/cluster/resources$"), recView: keepTypes("node")},
	{name: "GET /cluster/resources?type=vm", req: fixed("GET", "/cluster/resources?type=vm", ""),
		rec: both("GET ^/cluster/resources$"), recView: keepTypes("qemu", "lxc"),
		derived: "no recording filters by type=vm; pve-manager's filter keeps the qemu and lxc entries " +
			"of the unfiltered listing unchanged, so those are the reference"},
	{name: "GET /cluster/resources?type=storage", req: fixed("GET", "/cluster/resources?type=storage", ""),
		rec: both("GET ^/cluster/resources$"), recView: keepTypes("storage"),
		derived: "no recording filters by type=storage; the storage entries of the unfiltered listing are the reference"},
	{name: "GET /cluster/nextid", req: fixed("GET", "/cluster/nextid", ""),
		rec: both("GET /cluster/nextid$")}, // cluster.go
	{name: "GET /cluster/nextid?vmid=free", req: fixed("GET", "/cluster/nextid?vmid=150", ""),
		rec: both("GET /cluster/nextid$?vmid=100")},
	{name: "GET /cluster/nextid?vmid=taken (400)", req: fixed("GET", "/cluster/nextid?vmid=100", ""),
		rec: both("GET /cluster/nextid?vmid=200"), maps: []string{"errors"}},
	{name: "GET /nodes", req: fixed("GET", "/nodes", ""),
		rec: both("GET ^/nodes$")}, // nodes.go
	{name: "GET /nodes/{node}/status", req: fixed("GET", "/nodes/pve1/status", ""),
		rec: map[string][]string{"7": {"GET ^/nodes/node1/status$"}, // a capture of a real PVE 7.4 node
			"8": {"GET ^/nodes/node1/status$", "GET ^/nodes/node2/status$"},
			"9": {"GET ^/nodes/node1/status$", "GET ^/nodes/node2/status$"}}}, // nodes.go
	{name: "GET /nodes/{unknown}/status (500)", req: fixed("GET", "/nodes/nosuch/status", ""),
		rec: both("GET ^/nodes/doesntexist/status$")},
	{name: "GET /access/permissions", req: fixed("GET", "/access/permissions", ""),
		rec: both("GET ^/access/permissions$"), maps: []string{"data", "data.*"}}, // access.go
	{name: "GET /access/permissions?path=", req: fixed("GET", "/access/permissions?path=/vms/100", ""),
		rec: both("GET ^/access/permissions$?path=path"), maps: []string{"data", "data.*"}},
	{name: "GET /pools", req: fixed("GET", "/pools", ""),
		rec: both("GET ^/pools$")}, // pools.go
	{name: "GET /pools?poolid=", req: fixed("GET", "/pools/?poolid=fleet", ""), // the path go-proxmox's Pool uses
		rec: both("GET ^/pools/$?poolid=test-pool")},
	{name: "GET /nodes/{node}/qemu", req: fixed("GET", "/nodes/pve1/qemu", ""),
		rec: map[string][]string{"8": {"GET ^/nodes/node1/qemu/101/status/current$"},
			"9": {"GET ^/nodes/node1/qemu/101/status/current$", "GET ^/nodes/node1/qemu/102/status/current$"}},
		recView: asList, maps: []string{"data[].blockstat", "data[].nics"},
		derived: "no recording lists /nodes/{node}/qemu; its entries come from the same qemu-server " +
			"vmstatus() as status/current (without the QMP part), so those are the reference"},
	{name: "GET status/current (running)", req: fixed("GET", "/nodes/pve1/qemu/100/status/current", ""),
		rec: map[string][]string{"8": {"GET ^/nodes/node1/qemu/101/status/current$"},
			"9": {"GET ^/nodes/node1/qemu/101/status/current$", "GET ^/nodes/node1/qemu/102/status/current$"}},
		maps: []string{"data.blockstat", "data.nics"}}, // virtual_machines.go
	{name: "GET status/current (stopped)", req: fixed("GET", "/nodes/pve1/qemu/101/status/current", ""),
		rec: map[string][]string{"8": {"GET ^/nodes/node1/qemu/101/status/current$"},
			"9": {"GET ^/nodes/node1/qemu/101/status/current$", "GET ^/nodes/node1/qemu/102/status/current$"}},
		maps: []string{"data.blockstat", "data.nics"}},
	{name: "GET status/current (template)", req: fixed("GET", "/nodes/pve1/qemu/9000/status/current", ""),
		rec: map[string][]string{"8": {"GET ^/nodes/node1/qemu/101/status/current$"},
			"9": {"GET ^/nodes/node1/qemu/101/status/current$", "GET ^/nodes/node1/qemu/102/status/current$"}},
		maps: []string{"data.blockstat", "data.nics"}},
	{name: "GET /nodes/{node}/qemu/{unknown}/status/current (500)", req: fixed("GET", "/nodes/pve1/qemu/999/status/current", ""),
		rec: both("GET ^/nodes/doesntexist/status$"), derived: "the only recorded 500 answer; PVE's error body does not depend on the endpoint"},
	{name: "GET status/current without a token (401)", req: fixed("GET", "/nodes/pve1/qemu/100/status/current", ""),
		token: "PVEAPIToken=shape@pve!t=wrong", code: 401,
		rec: both("GET ^/nodes/doesntexist/status$"), derived: "no recorded 401; PVE's error body is {\"data\":null} for every status"},
	{name: "GET status/current without VM.Audit (403)", req: fixed("GET", "/nodes/pve1/qemu/100/status/current", ""),
		token: "PVEAPIToken=audit@pve!none=sec", code: 403,
		rec: both("GET ^/nodes/doesntexist/status$"), derived: "no recorded 403; PVE's error body is {\"data\":null} for every status"},
	{name: "GET config", req: fixed("GET", "/nodes/pve1/qemu/100/config", ""),
		rec: map[string][]string{"8": {"GET ^/nodes/node1/qemu/100/config$"},
			"9": {"GET ^/nodes/node1/qemu/100/config$", "GET ^/nodes/node1/qemu/101/config$", "GET ^/nodes/node1/qemu/102/config$"}}},
	{name: "GET config (template)", req: fixed("GET", "/nodes/pve1/qemu/9000/config", ""),
		rec: map[string][]string{"8": {"GET ^/nodes/node1/qemu/100/config$"},
			"9": {"GET ^/nodes/node1/qemu/100/config$", "GET ^/nodes/node1/qemu/101/config$", "GET ^/nodes/node1/qemu/102/config$"}}},
	{name: "POST config", req: fixed("POST", "/nodes/pve1/qemu/101/config", `{"cores":2}`),
		rec: both("POST ^/nodes/node1/qemu/100/config$")},
	{name: "PUT config", req: fixed("PUT", "/nodes/pve1/qemu/101/config", `{"memory":1024}`),
		rec: map[string][]string{"9": {"PUT ^/nodes/node1/qemu/100/config$"}}},
	{name: "POST config (400)", req: fixed("POST", "/nodes/pve1/qemu/101/config", `{"cores":"x"}`),
		rec: both("GET /cluster/nextid?vmid=200"), maps: []string{"errors"},
		derived: "the only recorded 400 answer; PVE's parameter errors have this shape on every endpoint"},
	{name: "POST status/start", req: fixed("POST", "/nodes/pve1/qemu/101/status/start", ""),
		rec: both("POST ^/nodes/node1/qemu/100/status/start$")},
	{name: "POST status/suspend", req: fixed("POST", "/nodes/pve1/qemu/100/status/suspend", ""),
		rec: both("POST ^/nodes/node1/qemu/100/status/suspend$")},
	{name: "POST status/resume", req: func(e *shapeEnv) (string, string, string) {
		e.s.SetPaused(105, true)
		return "POST", "/nodes/pve1/qemu/105/status/resume", ""
	}, rec: both("POST ^/nodes/node1/qemu/100/status/resume$")},
	{name: "POST status/shutdown", req: fixed("POST", "/nodes/pve2/qemu/102/status/shutdown", `{"timeout":60}`),
		rec: both("POST ^/nodes/node1/qemu/100/status/shutdown$")},
	{name: "POST status/stop", req: fixed("POST", "/nodes/pve1/qemu/100/status/stop", ""),
		rec: both("POST ^/nodes/node1/qemu/100/status/stop$")},
	{name: "DELETE /nodes/{node}/qemu/{vmid}", req: fixed("DELETE", "/nodes/pve1/qemu/103?purge=1&destroy-unreferenced-disks=1", ""),
		rec: both("DELETE ^/nodes/node1/qemu/999$")},
	{name: "POST clone", req: fixed("POST", "/nodes/pve1/qemu/9000/clone", `{"newid":200,"name":"c1","full":1,"pool":"fleet"}`),
		rec: both("POST ^/nodes/node1/qemu/101/clone")},
	{name: "POST clone onto a used VMID (500)", req: fixed("POST", "/nodes/pve1/qemu/9000/clone", `{"newid":101,"name":"c2","full":1}`),
		rec: both("GET ^/nodes/doesntexist/status$"), derived: "the only recorded 500 answer"},
	{name: "GET task status (finished)", req: func(e *shapeEnv) (string, string, string) {
		u := e.finished(e.upid("POST", "/nodes/pve1/qemu/101/config", `{"description":"x"}`))
		return "GET", "/nodes/pve1/tasks/" + u + "/status", ""
	}, rec: both("GET ^/nodes/node1/tasks/"+recTaskCompleted+"/status$", "GET ^/nodes/node1/tasks/"+recTaskFailed+"/status$")},
	{name: "GET task status (failed)", req: func(e *shapeEnv) (string, string, string) {
		e.s.FailTasks(KindStop, 1, "VM quit/powerdown failed")
		u := e.finished(e.upid("POST", "/nodes/pve1/qemu/104/status/stop", ""))
		return "GET", "/nodes/pve1/tasks/" + u + "/status", ""
	}, rec: both("GET ^/nodes/node1/tasks/"+recTaskCompleted+"/status$", "GET ^/nodes/node1/tasks/"+recTaskFailed+"/status$")},
	{name: "GET task status (running)", req: func(e *shapeEnv) (string, string, string) {
		u := e.upid("POST", "/nodes/pve1/qemu/104/status/shutdown", "")
		return "GET", "/nodes/pve1/tasks/" + u + "/status", ""
	}, rec: both("GET ^/nodes/node1/tasks/" + recTaskRunning + "/status$")},
	{name: "GET task log", req: func(e *shapeEnv) (string, string, string) {
		u := e.finished(e.upid("POST", "/nodes/pve1/qemu/101/config", `{"description":"y"}`))
		return "GET", "/nodes/pve1/tasks/" + u + "/log", ""
	}, rec: both("GET ^/nodes/node1/tasks/"+recTaskCompleted+"/log$?limit=50&start=0", "GET ^/nodes/node1/tasks/"+recTaskRunning+"/log$")},
	{name: "POST agent/ping", req: fixed("POST", "/nodes/pve2/qemu/102/agent/ping", ""),
		rec: both("POST ^/nodes/node1/qemu/101/agent/ping$")},
	{name: "POST agent/file-write", req: fixed("POST", "/nodes/pve2/qemu/102/agent/file-write", `{"file":"/tmp/x","content":"aGk=","encode":0}`),
		rec: both("POST ^/nodes/node1/qemu/101/agent/file-write$")},
	{name: "GET agent/get-osinfo", req: fixed("GET", "/nodes/pve2/qemu/102/agent/get-osinfo", ""),
		rec: map[string][]string{"9": {"GET ^/nodes/node1/qemu/101/agent/get-osinfo$"}}},
	{name: "POST agent/exec", req: fixed("POST", "/nodes/pve2/qemu/102/agent/exec", `{"command":["hostname"]}`),
		rec: map[string][]string{"9": {"POST ^/nodes/node1/qemu/101/agent/exec$"}}},
	{name: "GET agent/exec-status (exited, stdout)", req: func(e *shapeEnv) (string, string, string) {
		return "GET", fmt.Sprintf("/nodes/pve2/qemu/102/agent/exec-status?pid=%d", e.execPID(`{"command":["kubectl","drain"]}`)), ""
	}, rec: map[string][]string{"9": {"GET ^/nodes/node1/qemu/101/agent/exec-status$"}}},
	{name: "GET agent/exec-status (exited, stderr)", req: func(e *shapeEnv) (string, string, string) {
		return "GET", fmt.Sprintf("/nodes/pve2/qemu/102/agent/exec-status?pid=%d", e.execPID(`{"command":["no-such-command"]}`)), ""
	}, rec: map[string][]string{"9": {"GET ^/nodes/node1/qemu/101/agent/exec-status$"}}},
	{name: "GET agent/exec-status (killed)", req: func(e *shapeEnv) (string, string, string) {
		e.s.GuestOf(102).(*MemGuest).SetCommand([]string{"sleep"}, CommandResult{Signal: 9})
		return "GET", fmt.Sprintf("/nodes/pve2/qemu/102/agent/exec-status?pid=%d", e.execPID(`{"command":["sleep","600"]}`)), ""
	}, rec: map[string][]string{"9": {"GET ^/nodes/node1/qemu/101/agent/exec-status$"}}},
}

// unverified lists, per PVE major, the endpoints of shapeCases with no
// recording at all in that version, and the source their shape rests on.
// The test keeps this list and the recordings consistent.
var unverified = []struct{ endpoint, major, source string }{
	{"PUT config", "8", "recorded for PVE 9 only; qemu-server's update_vm (PUT) returns null in 8 and 9 " +
		"(PVE/API2/Qemu.pm: returns { type => 'null' })"},
	{"GET agent/get-osinfo", "8", "recorded for PVE 9 only; qemu-server passes QGA's guest-get-osinfo " +
		"through as {\"result\": ...} in 8 and 9 (PVE/API2/Qemu/Agent.pm)"},
	{"POST agent/exec", "8", "recorded for PVE 9 only; {\"pid\": n} is QGA's guest-exec answer, passed through"},
	{"GET agent/exec-status (exited, stdout)", "8", "recorded for PVE 9 only; PVE/QemuServer/Agent.pm " +
		"qemu_exec_status is the same in 8 and 9 (base64-decodes out-data/err-data, booleans to 1/0)"},
	{"GET agent/exec-status (exited, stderr)", "8", "as above"},
	{"GET agent/exec-status (killed)", "8", "as above"},
}

// TestShapesMatchRecordedPVE holds every answer pvesim gives against the
// answers go-proxmox recorded from PVE 8 and PVE 9 (recordingsModule):
// keys, JSON types, nesting and the UPID form. Differences fail the test
// unless listed in deviations.
func TestShapesMatchRecordedPVE(t *testing.T) {
	versions := map[string]string{"7": "7.4.16", "8": "8.2.4", "9": "9.0.3"}
	used := map[string]bool{}
	want, ran := 0, 0 // subtests expected and run: a -run filter skips the stale check
	for _, major := range []string{"7", "8", "9"} {
		e := newShapeEnv(t, versions[major])
		for _, c := range shapeCases {
			keys, ok := c.rec[major]
			if !ok {
				if major != "7" && !isUnverified(c.name, major) {
					t.Errorf("PVE %s: %q has no recording and is not listed in unverified", major, c.name)
				}
				continue
			}
			if isUnverified(c.name, major) {
				t.Errorf("PVE %s: %q has recordings %q but is listed in unverified", major, c.name, keys)
			}
			want++
			t.Run("PVE"+major+"/"+c.name, func(t *testing.T) {
				ran++
				e.t = t
				if c.derived != "" {
					t.Logf("no recording of this endpoint: %s", c.derived)
				}
				recs := recorded(t, major, keys)
				maps := map[string]bool{}
				for _, m := range c.maps {
					maps[m] = true
				}
				rec := newShape()
				code := 0
				for i, r := range recs {
					v, err := decodeJSON(r.body)
					if err != nil {
						t.Fatalf("recording %q: %v", keys[i], err)
					}
					if c.recView != nil {
						v = c.recView(v)
					}
					rec.add(v, "", maps)
					code = r.status
				}
				if c.code != 0 {
					code = c.code
				}
				method, path, body := c.req(e)
				var got simResp
				if c.token != "" {
					got = e.doAs(c.token, method, path, body)
				} else {
					got = e.do(method, path, body)
				}
				if got.code != code {
					t.Errorf("%s %s: status %d, recorded %d (%s)", method, path, got.code, code, got.body)
				}
				v, err := decodeJSON(got.body)
				if err != nil {
					t.Fatalf("%s %s: %v: %s", method, path, err, got.body)
				}
				sim := newShape()
				sim.add(v, "", maps)
				var unexplained []string
				for _, d := range compareShapes(sim, rec) {
					if key, ok := allowed(c.name, major, d.String()); ok {
						used[key] = true
						continue
					}
					unexplained = append(unexplained, d.String())
				}
				if diff := cmp.Diff([]string(nil), unexplained); diff != "" {
					t.Errorf("%s %s differs from the PVE %s recordings %q (-recorded +pvesim):\n%s\npvesim answered: %s",
						method, path, major, keys, diff, got.body)
				}
			})
		}
	}
	if ran != want || t.Failed() {
		return
	}
	for i, dv := range deviations {
		for _, d := range dv.diffs {
			if !used[fmt.Sprintf("%d/%s", i, d)] {
				t.Errorf("deviation %q (on %q, PVE %q) no longer occurs; remove it", d, dv.endpoints, dv.majors)
			}
		}
	}
}

func isUnverified(endpoint, major string) bool {
	for _, u := range unverified {
		if u.endpoint == endpoint && u.major == major {
			return true
		}
	}
	return false
}

// allowed reports the deviation entry accepting d, if any.
func allowed(endpoint, major, d string) (string, bool) {
	for i, dv := range deviations {
		if dv.majors != nil && !contains(dv.majors, major) || !contains(dv.endpoints, endpoint) || !contains(dv.diffs, d) {
			continue
		}
		return fmt.Sprintf("%d/%s", i, d), true
	}
	return "", false
}

// TestShapeComparison checks the comparison itself on small answers.
func TestShapeComparison(t *testing.T) {
	cases := []struct {
		name string
		rec  []string
		sim  string
		maps []string
		want []string
	}{
		{name: "same", rec: []string{`{"data":{"a":1,"b":"x"}}`}, sim: `{"data":{"b":"y","a":2}}`},
		{name: "string vs number", rec: []string{`{"data":{"a":"1"}}`}, sim: `{"data":{"a":1}}`,
			want: []string{"type data.a: pvesim integer, recorded string"}},
		{name: "float where integer", rec: []string{`{"data":{"a":1}}`}, sim: `{"data":{"a":1.5}}`,
			want: []string{"type data.a: pvesim float, recorded integer"}},
		{name: "integer where float", rec: []string{`{"data":{"a":0.5}}`}, sim: `{"data":{"a":0}}`},
		{name: "missing and extra", rec: []string{`{"data":{"a":1}}`}, sim: `{"data":{"b":{"c":1}}}`,
			want: []string{"extra data.b: object", "missing data.a"}},
		{name: "optional across recordings", rec: []string{`{"data":{"a":1,"t":"x"}}`, `{"data":{"a":2}}`}, sim: `{"data":{"a":3}}`},
		{name: "typed list elements", rec: []string{`{"data":[{"type":"node","n":1},{"type":"qemu","v":1}]}`},
			sim:  `{"data":[{"type":"qemu","v":"1"}]}`,
			want: []string{"type data[qemu].v: pvesim string, recorded integer", "missing data[node]"}},
		{name: "empty list", rec: []string{`{"data":[{"n":1}]}`}, sim: `{"data":[]}`},
		{name: "UPID form", rec: []string{`{"data":"UPID:n:00000001:00000001:00000001:qmstart:100:root@pam:"}`},
			sim: `{"data":"UPID:n:1:1:1:qmstart:100:root@pam"}`, want: []string{"type data: pvesim malformed-upid, recorded upid"}},
		{name: "UPID vs null", rec: []string{`{"data":null}`}, sim: `{"data":"UPID:n:00000001:00000001:00000001:qmstart:100:root@pam:"}`,
			want: []string{"type data: pvesim upid, recorded null"}},
		{name: "data-keyed map", rec: []string{`{"data":{"/":{"VM.Audit":1}}}`}, sim: `{"data":{"/vms":{"Sys.Audit":1}}}`,
			maps: []string{"data", "data.*"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			maps := map[string]bool{}
			for _, m := range c.maps {
				maps[m] = true
			}
			rec, sim := newShape(), newShape()
			for _, r := range c.rec {
				v, err := decodeJSON([]byte(r))
				if err != nil {
					t.Fatal(err)
				}
				rec.add(v, "", maps)
			}
			v, err := decodeJSON([]byte(c.sim))
			if err != nil {
				t.Fatal(err)
			}
			sim.add(v, "", maps)
			var got []string
			for _, d := range compareShapes(sim, rec) {
				got = append(got, d.String())
			}
			sort.Strings(got)
			sort.Strings(c.want)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("differences (-want +got):\n%s", diff)
			}
		})
	}
}
