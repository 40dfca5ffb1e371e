package pvesim

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

const apiPrefix = "/api2/json"

// Handler returns the HTTP handler serving /api2/json.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHooked) }

// params holds request parameters from the query string and the body
// (JSON as go-proxmox sends it, or form-encoded as curl/pvesh send it).
type params map[string]any

func (p params) has(k string) bool { _, ok := p[k]; return ok }

func (p params) str(k string) string {
	switch v := p[k].(type) {
	case nil:
		return ""
	case string:
		return v
	case json.Number:
		return v.String()
	case bool:
		if v {
			return "1"
		}
		return "0"
	default:
		return fmt.Sprint(v)
	}
}

func (p params) num(k string) (int, error) {
	s := p.str(k)
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("type check ('integer') failed - got '%s'", s)
	}
	return int(f), nil
}

func (p params) boolean(k string, def bool) bool {
	s := strings.ToLower(p.str(k))
	switch s {
	case "":
		return def
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func readParams(r *http.Request) (params, error) {
	p := params{}
	for k, v := range r.URL.Query() {
		p[k] = v[len(v)-1]
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return p, nil
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") || body[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			return nil, fmt.Errorf("invalid JSON body: %w", err)
		}
		for k, v := range m {
			p[k] = v
		}
		return p, nil
	}
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, err
	}
	for k, v := range vals {
		p[k] = v[len(v)-1]
	}
	return p, nil
}

// apiError is a failure PVE reports in the status line.
type apiError struct {
	code   int
	reason string
	errors map[string]string // 400 parameter errors
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.code, e.reason) }

func errf(code int, format string, args ...any) *apiError {
	return &apiError{code: code, reason: fmt.Sprintf(format, args...)}
}

func badParam(name, msg string) *apiError {
	return &apiError{code: 400, reason: "Parameter verification failed.", errors: map[string]string{name: msg}}
}

func lockErr(vmid int) *apiError {
	return errf(500, "can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", vmid)
}

func noConf(node string, vmid int) *apiError {
	return errf(500, "Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", node, vmid)
}

var reasonClean = strings.NewReplacer("\r", " ", "\n", " ")

// writeStatus writes a response with a custom reason phrase, which
// net/http cannot do: it hijacks the connection and writes the status line
// itself, as PVE's server does. The connection is closed afterwards.
func writeStatus(w http.ResponseWriter, code int, reason string, body []byte) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		w.WriteHeader(code)
		_, _ = w.Write(body)
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(buf, "HTTP/1.1 %03d %s\r\nContent-Type: application/json;charset=UTF-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		code, reasonClean.Replace(reason), len(body))
	_, _ = buf.Write(body)
	_ = buf.Flush()
}

func writeData(w http.ResponseWriter, data any) {
	b, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		writeStatus(w, 500, "encode response: "+err.Error(), []byte(`{"data":null}`))
		return
	}
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	_, _ = w.Write(b)
}

func writeErr(w http.ResponseWriter, e *apiError) {
	body := map[string]any{"data": nil}
	if e.errors != nil {
		body["errors"] = e.errors
	}
	b, _ := json.Marshal(body)
	writeStatus(w, e.code, e.reason, b)
}

type request struct {
	method string
	path   string // below /api2/json
	parts  []string
	p      params
	tok    *Token
	r      *http.Request
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, apiPrefix)
	if path == r.URL.Path {
		writeErr(w, errf(404, "Not Found"))
		return
	}
	s.mu.Lock()
	s.total++
	s.requests[r.Method+" "+path]++
	tok := s.auth(r.Header.Get("Authorization"))
	f := s.faults.take(r.Method, path)
	s.mu.Unlock()

	if tok == nil {
		s.log.Debug("pvesim request", "method", r.Method, "path", path, "code", 401)
		writeErr(w, errf(401, "No ticket"))
		return
	}
	if f != nil {
		switch f.kind {
		case faultDelay:
			select {
			case <-time.After(f.delay):
			case <-r.Context().Done():
				return
			}
		case faultStatus, faultForbidden:
			writeErr(w, errf(f.code, "%s", f.reason))
			return
		case faultLock:
			id := 0
			if m := vmidInPath.FindStringSubmatch(path); m != nil {
				id, _ = strconv.Atoi(m[1])
			}
			writeErr(w, lockErr(id))
			return
		}
	}
	p, err := readParams(r)
	if err != nil {
		writeErr(w, errf(400, "%s", err.Error()))
		return
	}
	req := &request{method: r.Method, path: path, parts: strings.Split(strings.Trim(path, "/"), "/"), p: p, tok: tok, r: r}
	data, aerr := s.route(req)
	code := 200
	if aerr != nil {
		code = aerr.code
		writeErr(w, aerr)
	} else {
		writeData(w, data)
	}
	s.log.Debug("pvesim request", "method", r.Method, "path", path, "code", code)
}

var vmidInPath = regexp.MustCompile(`/qemu/(\d+)`)

// auth returns the token named by a "PVEAPIToken=ID=SECRET" header; s.mu
// must be held.
func (s *Server) auth(h string) *Token {
	v, ok := strings.CutPrefix(h, "PVEAPIToken=")
	if !ok {
		return nil
	}
	id, secret, ok := strings.Cut(v, "=")
	if !ok {
		return nil
	}
	t := s.tokens[id]
	if t == nil || t.Secret != secret {
		return nil
	}
	return t
}

// privs computes the effective privileges of a token at path: grants on
// the path and every ancestor, and for /vms/<id> also on the VM's pool.
// s.mu must be held.
func (s *Server) privs(t *Token, path string) map[string]bool {
	out := map[string]bool{}
	add := func(p string) {
		for _, pr := range t.ACL[p] {
			out[pr] = true
		}
	}
	add("/")
	acc := ""
	for _, seg := range strings.Split(strings.Trim(path, "/"), "/") {
		if seg == "" {
			continue
		}
		acc += "/" + seg
		add(acc)
	}
	if rest, ok := strings.CutPrefix(path, "/vms/"); ok {
		if id, err := strconv.Atoi(rest); err == nil {
			if v := s.vms[id]; v != nil && v.pool != "" {
				add("/pool")
				add("/pool/" + v.pool)
			}
		}
	}
	return out
}

func (s *Server) check(t *Token, path string, privs ...string) *apiError {
	have := s.privs(t, path)
	for _, p := range privs {
		if !have[p] {
			return errf(403, "Permission check failed (%s, %s)", path, p)
		}
	}
	return nil
}

func (s *Server) major() int {
	maj, _ := strconv.Atoi(strings.SplitN(s.opts.Version, ".", 2)[0])
	return maj
}

// agentPriv is the privilege an agent command needs on this PVE version.
func (s *Server) agentPriv(cmd string) string {
	if s.major() < 9 {
		return "VM.Monitor"
	}
	switch cmd {
	case "file-write":
		return "VM.GuestAgent.FileWrite"
	case "exec", "exec-status":
		return "VM.GuestAgent.Unrestricted"
	}
	return "VM.GuestAgent.Audit"
}

func (s *Server) route(q *request) (any, *apiError) {
	pt := q.parts
	get := q.method == http.MethodGet
	switch {
	case get && q.path == "/version":
		return map[string]any{"version": s.opts.Version, "release": strings.Join(strings.SplitN(s.opts.Version, ".", 3)[:2], "."), "repoid": "5f9a9f6c"}, nil
	case get && q.path == "/cluster/status":
		return s.clusterStatus(q)
	case get && q.path == "/cluster/resources":
		return s.resources(q)
	case get && q.path == "/cluster/nextid":
		return s.nextID(q)
	case get && q.path == "/nodes":
		return s.nodeList(q)
	case get && q.path == "/access/permissions":
		return s.permissions(q)
	case get && (q.path == "/pools" || q.path == "/pools/"):
		return s.poolList(q)
	case len(pt) >= 2 && pt[0] == "nodes":
		node := pt[1]
		if !s.hasNode(node) {
			return nil, errf(500, "hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", node, node)
		}
		if s.nodeDown(node) {
			return nil, errf(595, "Errors during connection establishment, proxy handler: No route to host")
		}
		rest := pt[2:]
		switch {
		case get && len(rest) == 1 && rest[0] == "status":
			return s.nodeStatus(q, node)
		case get && len(rest) == 3 && rest[0] == "storage" && rest[2] == "status":
			return s.storageStatus(q, node, rest[1])
		case get && len(rest) == 1 && rest[0] == "qemu":
			return s.qemuList(q, node)
		case len(rest) >= 3 && rest[0] == "tasks" && get:
			return s.taskGet(node, rest[1], rest[2:])
		case len(rest) >= 2 && rest[0] == "qemu":
			id, err := strconv.Atoi(rest[1])
			if err != nil || id < 100 {
				return nil, badParam("vmid", "value must have a minimum value of 100")
			}
			return s.qemu(q, node, id, rest[2:])
		}
	}
	return nil, errf(501, "Method '%s %s' not implemented", q.method, q.path)
}

func (s *Server) hasNode(n string) bool {
	for _, x := range s.nodes {
		if x == n {
			return true
		}
	}
	return false
}

// nodeDown reports whether a node is not online (see SetNodeStatus).
func (s *Server) nodeDown(n string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, down := s.down[n]
	return down
}

// nodeStatusOf is a node's cluster status; s.mu must be held.
func (s *Server) nodeStatusOf(n string) string {
	if st, ok := s.down[n]; ok {
		return st
	}
	return "online"
}

func (s *Server) clusterStatus(q *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.check(q.tok, "/", "Sys.Audit"); e != nil {
		return nil, e
	}
	out := []map[string]any{{"type": "cluster", "id": "cluster", "name": "pvesim", "version": 3, "quorate": 1, "nodes": len(s.nodes)}}
	for i, n := range s.nodes {
		out = append(out, map[string]any{"type": "node", "id": "node/" + n, "name": n, "ip": fmt.Sprintf("10.0.0.%d", i+1),
			"online": b2i(s.nodeStatusOf(n) == "online"), "local": b2i(i == 0), "level": "", "nodeid": i + 1})
	}
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// resourceOf is a VM's resource entry: in /cluster/resources (withPool:
// "pool" names the VM's pool, as pve-manager adds it there) or as a member
// in GET /pools, whose recorded entries carry no "pool".
func (s *Server) resourceOf(v *vm, withPool bool) map[string]any {
	r := map[string]any{
		"id": fmt.Sprintf("qemu/%d", v.vmid), "type": "qemu", "vmid": v.vmid, "name": v.name, "node": v.node,
		"status": v.status, "template": b2i(v.template), "maxmem": uint64(v.memory) << 20, "maxcpu": v.cores * v.sockets,
		"maxdisk": uint64(8) << 30, "disk": 0, "mem": 0, "cpu": 0, "uptime": 0, "netin": 0, "netout": 0,
		"diskread": 0, "diskwrite": 0,
	}
	if v.tags != "" {
		r["tags"] = v.tags
	}
	if withPool && v.pool != "" {
		r["pool"] = v.pool
	}
	if v.lock != "" {
		r["lock"] = v.lock
	}
	if v.status == "running" {
		r["uptime"] = uint64(time.Since(v.startedAt).Seconds())
		r["mem"] = uint64(v.memory) << 19
	}
	if s.nodeStatusOf(v.node) != "online" {
		// PVE has no fresh statistics of a VM on a node that is not online.
		r["status"] = "unknown"
		for _, k := range []string{"uptime", "mem", "cpu", "disk", "netin", "netout", "diskread", "diskwrite"} {
			delete(r, k)
		}
	}
	return r
}

// nodeResource is a node's /cluster/resources entry (cgroup-mode 2: the
// unified cgroup hierarchy of PVE 7 and later). A node that is not online
// has no current statistics (PVE::API2Tools::extract_node_stats).
func nodeResource(n, status string) map[string]any {
	if status != "online" {
		return map[string]any{"id": "node/" + n, "type": "node", "node": n, "status": status, "level": "",
			"cgroup-mode": 2, "maxcpu": 16, "maxmem": uint64(64) << 30, "maxdisk": uint64(1) << 40}
	}
	return map[string]any{"id": "node/" + n, "type": "node", "node": n, "status": "online", "level": "",
		"cgroup-mode": 2, "maxcpu": 16, "cpu": 0.05, "maxmem": uint64(64) << 30, "mem": uint64(8) << 30,
		"maxdisk": uint64(1) << 40, "disk": uint64(100) << 30, "uptime": 86400}
}

// storageResource is the /cluster/resources entry of the clone storage on
// node n (an LVM-thin pool, as PVE's default local-lvm).
func (s *Server) storageResource(n string) map[string]any {
	return map[string]any{"id": "storage/" + n + "/" + s.opts.Storage, "type": "storage", "storage": s.opts.Storage,
		"node": n, "status": "available", "plugintype": "lvmthin", "content": "images,rootdir", "shared": 0,
		"disk": uint64(100) << 30, "maxdisk": uint64(1) << 40}
}

func (s *Server) sortedVMs() []*vm {
	out := make([]*vm, 0, len(s.vms))
	for _, v := range s.vms {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].vmid < out[j].vmid })
	return out
}

func (s *Server) resources(q *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := q.p.str("type")
	out := []map[string]any{}
	if typ == "" || typ == "node" {
		for _, n := range s.nodes {
			out = append(out, nodeResource(n, s.nodeStatusOf(n)))
		}
	}
	if typ == "" || typ == "vm" {
		for _, v := range s.sortedVMs() {
			if s.privs(q.tok, fmt.Sprintf("/vms/%d", v.vmid))["VM.Audit"] {
				out = append(out, s.resourceOf(v, true))
			}
		}
	}
	if (typ == "" || typ == "storage") && s.privs(q.tok, "/storage/"+s.opts.Storage)["Datastore.Audit"] {
		for _, n := range s.nodes {
			out = append(out, s.storageResource(n))
		}
	}
	return out, nil
}

func (s *Server) lowestFree() int {
	for id := 100; ; id++ {
		if _, ok := s.vms[id]; !ok {
			return id
		}
	}
}

func (s *Server) nextID(q *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.p.has("vmid") {
		id, err := q.p.num("vmid")
		if err != nil {
			return nil, badParam("vmid", err.Error())
		}
		if _, ok := s.vms[id]; ok {
			return nil, badParam("vmid", fmt.Sprintf("VM %d already exists", id))
		}
		return strconv.Itoa(id), nil
	}
	if s.faults.fixedNext != 0 {
		s.faults.nextIDHits++
		return strconv.Itoa(s.faults.fixedNext), nil
	}
	return strconv.Itoa(s.lowestFree()), nil // a JSON string, as PVE sends it
}

func (s *Server) nodeList(q *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, n := range s.nodes {
		out = append(out, map[string]any{"node": n, "status": s.nodeStatusOf(n), "type": "node", "id": "node/" + n, "level": "",
			"maxcpu": 16, "maxmem": uint64(64) << 30, "mem": uint64(8) << 30, "maxdisk": uint64(1) << 40, "disk": uint64(100) << 30,
			"cpu": 0.05, "uptime": 86400, "ssl_fingerprint": "00:11"})
	}
	return out, nil
}

// storageStatus is GET /nodes/{node}/storage/{storage}/status: the
// storage's size and what is free of it on node (PVE answers an unknown
// storage with a 500).
func (s *Server) storageStatus(q *request, node, storage string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.check(q.tok, "/storage/"+storage, "Datastore.Audit"); e != nil {
		return nil, e
	}
	st, ok := s.storageSpec(storage)
	if !ok {
		return nil, errf(500, "storage '%s' does not exist", storage)
	}
	typ, shared := "lvmthin", 0
	if st.Shared {
		typ, shared = "rbd", 1
	}
	free := s.storageFree(st, node)
	return map[string]any{"type": typ, "content": "images,rootdir", "active": 1, "enabled": 1, "shared": shared,
		"total": st.Bytes, "avail": free, "used": st.Bytes - min(free, st.Bytes)}, nil
}

func (s *Server) nodeStatus(q *request, node string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.check(q.tok, "/nodes/"+node, "Sys.Audit"); e != nil {
		return nil, e
	}
	h := s.opts.Host
	return map[string]any{
		"kversion": "Linux 6.8.12-1-pve", "pveversion": "pve-manager/" + s.opts.Version, "loadavg": []string{"0.10", "0.20", "0.30"},
		"cpu": 0.05, "wait": 0.0, "idle": 0, "uptime": 86400,
		"cpuinfo": map[string]any{"model": "Simulated CPU", "cores": h.CPUs, "sockets": 1, "cpus": h.CPUs, "mhz": "2400.000", "hvm": "1", "user_hz": 100, "flags": "sse4_2"},
		"memory":  map[string]any{"total": h.MemoryBytes, "used": h.MemoryBytes / 8, "free": h.MemoryBytes - h.MemoryBytes/8},
		"swap":    map[string]any{"total": 0, "used": 0, "free": 0},
		"rootfs":  map[string]any{"total": uint64(100) << 30, "used": uint64(10) << 30, "avail": uint64(90) << 30, "free": uint64(90) << 30},
		"ksm":     map[string]any{"shared": 0},
	}, nil
}

// vmStatus is qemu-server's vmstatus() for one VM without QMP queries
// (full=0), as GET /nodes/{node}/qemu lists it: pid only while running;
// template, lock and tags only when set.
func (s *Server) vmStatus(v *vm) map[string]any {
	st := map[string]any{
		"vmid": v.vmid, "name": v.name, "status": v.status, "cpus": v.cores * v.sockets,
		"maxmem": uint64(v.memory) << 20, "mem": 0, "maxdisk": uint64(8) << 30, "disk": 0, "uptime": 0, "cpu": 0,
		"netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if v.template {
		st["template"] = 1 // only templates carry the key: go-proxmox treats any value as true
	}
	if v.tags != "" {
		st["tags"] = v.tags
	}
	if v.lock != "" {
		st["lock"] = v.lock
	}
	if v.status == "running" {
		st["pid"] = 10000 + v.vmid
		st["uptime"] = uint64(time.Since(v.startedAt).Seconds())
		st["mem"] = uint64(v.memory) << 19
	}
	return st
}

// statusOf is GET status/current: vmstatus() with QMP queries (full=1),
// plus "ha", and "agent" only when the agent is enabled in the config.
// The QMP-derived keys (qmpstatus aside) exist only while the VM runs.
func (s *Server) statusOf(v *vm) map[string]any {
	st := s.vmStatus(v)
	st["qmpstatus"] = v.status
	st["ha"] = map[string]any{"managed": 0}
	if v.agent {
		st["agent"] = 1
	}
	if v.status != "running" {
		return st
	}
	if v.paused {
		st["qmpstatus"] = "paused"
	}
	qemu, machine := "9.0.2", "pc-i440fx-9.0+pve0"
	if s.major() >= 9 {
		qemu, machine = "10.0.2", "pc-i440fx-10.0+pve0"
	}
	st["running-qemu"], st["running-machine"] = qemu, machine
	maxmem, used := uint64(v.memory)<<20, uint64(v.memory)<<19
	st["balloon"], st["freemem"] = maxmem, maxmem-used
	st["ballooninfo"] = map[string]any{"actual": maxmem, "max_mem": maxmem, "total_mem": maxmem, "free_mem": maxmem - used,
		"major_page_faults": 0, "minor_page_faults": 0, "mem_swapped_in": 0, "mem_swapped_out": 0,
		"last_update": time.Now().Unix()}
	st["nics"] = map[string]any{fmt.Sprintf("tap%di0", v.vmid): map[string]any{"netin": 0, "netout": 0}}
	st["blockstat"] = map[string]any{"scsi0": blockStats()}
	st["proxmox-support"] = map[string]any{"backup-max-workers": true, "pbs-dirty-bitmap": true,
		"pbs-dirty-bitmap-migration": true, "pbs-dirty-bitmap-savevm": true, "pbs-masterkey": true,
		"query-bitmap-info": true, "pbs-library-version": "1.5.1 (UNKNOWN)"}
	return st
}

// blockStats is QMP's BlockDeviceStats of an idle drive, as query-blockstats
// reports it (qemu-server passes the object through unchanged).
func blockStats() map[string]any {
	st := map[string]any{"account_failed": true, "account_invalid": true, "timed_stats": []any{}}
	for _, k := range []string{"rd_bytes", "wr_bytes", "rd_operations", "wr_operations", "flush_operations",
		"unmap_operations", "unmap_bytes", "rd_merged", "wr_merged", "unmap_merged", "rd_total_time_ns",
		"wr_total_time_ns", "flush_total_time_ns", "unmap_total_time_ns", "idle_time_ns", "wr_highest_offset",
		"failed_rd_operations", "failed_wr_operations", "failed_flush_operations", "failed_unmap_operations",
		"invalid_rd_operations", "invalid_wr_operations", "invalid_flush_operations", "invalid_unmap_operations"} {
		st[k] = 0
	}
	return st
}

func (s *Server) qemuList(q *request, node string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, v := range s.sortedVMs() {
		if v.node == node && s.privs(q.tok, fmt.Sprintf("/vms/%d", v.vmid))["VM.Audit"] {
			out = append(out, s.vmStatus(v))
		}
	}
	return out, nil
}

func (s *Server) configOf(v *vm) map[string]any {
	c := map[string]any{
		"digest": v.digest(), "name": v.name, "cores": v.cores, "sockets": v.sockets,
		"memory": strconv.Itoa(v.memory), // PVE 8 sends a string
		"net0":   v.net0, "scsi0": v.scsi0, "scsihw": "virtio-scsi-single", "ostype": "l26", "boot": "order=scsi0;net0",
		"vmgenid": "00000000-0000-4000-8000-000000000000", "smbios1": "uuid=00000000-0000-4000-8000-000000000001",
	}
	for k, d := range v.drives {
		c[k] = d
	}
	if v.agent {
		c["agent"] = "1"
	}
	if v.description != "" {
		c["description"] = v.description
	}
	if v.tags != "" {
		c["tags"] = v.tags
	}
	if v.onboot {
		c["onboot"] = 1
	}
	if v.template {
		c["template"] = 1
	}
	if v.lock != "" {
		c["lock"] = v.lock
	}
	return c
}

var dnsName = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?$`)
var tagRe = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_\-+.]*$`)

func normTags(s string) (string, error) {
	var out []string
	for _, t := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' }) {
		if !tagRe.MatchString(t) {
			return "", fmt.Errorf("invalid format - invalid characters in tag '%s'", t)
		}
		out = append(out, t)
	}
	return strings.Join(out, ";"), nil
}

// configKeys maps each settable key to the privilege it needs.
var configKeys = map[string]string{
	"cores": "VM.Config.CPU", "sockets": "VM.Config.CPU", "memory": "VM.Config.Memory",
	"name": "VM.Config.Options", "description": "VM.Config.Options", "tags": "VM.Config.Options",
	"onboot": "VM.Config.Options", "agent": "VM.Config.Options",
}

// applyConfig validates and returns a function applying p to v; s.mu held.
func (s *Server) prepareConfig(q *request, v *vm) (func(), *apiError) {
	path := fmt.Sprintf("/vms/%d", v.vmid)
	var set []func()
	var dels []string
	if d := q.p.str("delete"); d != "" {
		dels = strings.FieldsFunc(d, func(r rune) bool { return r == ',' || r == ';' || r == ' ' })
	}
	keys := make([]string, 0, len(q.p))
	for k := range q.p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch k {
		case "delete", "digest", "skiplock", "background_delay":
			continue
		}
		priv, ok := configKeys[k]
		if !ok {
			return nil, badParam(k, "property is not defined in schema and the schema does not allow additional properties")
		}
		if e := s.check(q.tok, path, priv); e != nil {
			return nil, e
		}
		switch k {
		case "cores", "sockets", "memory":
			n, err := q.p.num(k)
			if err != nil {
				return nil, badParam(k, err.Error())
			}
			if n < 1 || (k == "memory" && n < 16) {
				return nil, badParam(k, fmt.Sprintf("value must have a minimum value of %d", map[bool]int{true: 16, false: 1}[k == "memory"]))
			}
			switch k {
			case "cores":
				set = append(set, func() { v.cores = n })
			case "sockets":
				set = append(set, func() { v.sockets = n })
			default:
				set = append(set, func() { v.memory = n })
			}
		case "name":
			n := q.p.str(k)
			if !dnsName.MatchString(n) {
				return nil, badParam(k, "invalid format - value does not look like a valid DNS name")
			}
			set = append(set, func() { v.name = n })
		case "description":
			d := q.p.str(k)
			if len(d) > 8*1024 {
				return nil, badParam(k, "value may only be 8192 characters long")
			}
			set = append(set, func() { v.description = d })
		case "tags":
			t, err := normTags(q.p.str(k))
			if err != nil {
				return nil, badParam(k, err.Error())
			}
			set = append(set, func() { v.tags = t })
		case "onboot":
			b := q.p.boolean(k, false)
			set = append(set, func() { v.onboot = b })
		case "agent":
			b := q.p.boolean(k, false)
			set = append(set, func() { v.agent = b })
		}
	}
	for _, k := range dels {
		switch k {
		case "description":
			set = append(set, func() { v.description = "" })
		case "tags":
			set = append(set, func() { v.tags = "" })
		case "onboot":
			set = append(set, func() { v.onboot = false })
		default:
			return nil, badParam("delete", fmt.Sprintf("cannot delete '%s'", k))
		}
	}
	if d := q.p.str("digest"); d != "" && d != v.digest() {
		return nil, errf(500, "detected modified configuration - file changed by other user? Try again.")
	}
	return func() {
		for _, f := range set {
			f()
		}
	}, nil
}

func (s *Server) qemu(q *request, node string, id int, rest []string) (any, *apiError) {
	get := q.method == http.MethodGet
	if len(rest) == 1 && rest[0] == "clone" && q.method == http.MethodPost {
		return s.clone(q, node, id)
	}
	s.mu.Lock()
	v := s.vms[id]
	if v == nil || v.node != node {
		s.mu.Unlock()
		return nil, noConf(node, id)
	}
	path := fmt.Sprintf("/vms/%d", id)
	switch {
	case get && len(rest) == 2 && rest[0] == "status" && rest[1] == "current":
		defer s.mu.Unlock()
		if e := s.check(q.tok, path, "VM.Audit"); e != nil {
			return nil, e
		}
		return s.statusOf(v), nil
	case get && len(rest) == 1 && rest[0] == "config":
		defer s.mu.Unlock()
		if e := s.check(q.tok, path, "VM.Audit"); e != nil {
			return nil, e
		}
		return s.configOf(v), nil
	case (q.method == http.MethodPost || q.method == http.MethodPut) && len(rest) == 1 && rest[0] == "config":
		defer s.mu.Unlock()
		if v.busy != "" {
			return nil, lockErr(id)
		}
		if v.lock != "" && !q.p.boolean("skiplock", false) {
			return nil, errf(500, "VM is locked (%s)", v.lock)
		}
		apply, e := s.prepareConfig(q, v)
		if e != nil {
			return nil, e
		}
		if q.method == http.MethodPut {
			apply()
			return nil, nil
		}
		return s.startTask(node, KindConfig, id, q.tok.ID, id, func(*Server) string { apply(); return "OK" }), nil
	case q.method == http.MethodPost && len(rest) == 2 && rest[0] == "status":
		defer s.mu.Unlock()
		return s.power(q, v, rest[1])
	case q.method == http.MethodDelete && len(rest) == 0:
		defer s.mu.Unlock()
		if e := s.check(q.tok, path, "VM.Allocate"); e != nil {
			return nil, e
		}
		if v.busy != "" {
			return nil, lockErr(id)
		}
		if v.status == "running" {
			return nil, errf(500, "VM %d is running - destroy failed", id)
		}
		if v.lock != "" && !q.p.boolean("skiplock", false) {
			return nil, errf(500, "VM is locked (%s)", v.lock)
		}
		return s.startTask(node, KindDestroy, id, q.tok.ID, id, func(s *Server) string {
			delete(s.vms, id)
			return "OK"
		}), nil
	case len(rest) == 2 && rest[0] == "agent":
		g, e := s.agentGate(q, v, rest[1])
		s.mu.Unlock()
		if e != nil {
			return nil, e
		}
		return s.agent(q, id, g, rest[1])
	}
	s.mu.Unlock()
	return nil, errf(501, "Method '%s %s' not implemented", q.method, q.path)
}

func (s *Server) power(q *request, v *vm, action string) (any, *apiError) {
	id := v.vmid
	if e := s.check(q.tok, fmt.Sprintf("/vms/%d", id), "VM.PowerMgmt"); e != nil {
		return nil, e
	}
	if v.busy != "" {
		return nil, lockErr(id)
	}
	if v.template {
		return nil, errf(500, "you can't start a vm if it's a template")
	}
	user := q.tok.ID
	switch action {
	case "start":
		if v.status == "running" {
			return nil, errf(500, "VM %d already running", id)
		}
		if v.lock != "" {
			return nil, errf(500, "VM is locked (%s)", v.lock)
		}
		return s.startTask(v.node, KindStart, id, user, id, func(s *Server) string {
			now := time.Now()
			v.status, v.paused, v.startedAt = "running", false, now
			if at := now.Add(s.agentBoot()); at.After(v.agentAt) {
				v.agentAt = at
			}
			return "OK"
		}), nil
	case "stop":
		return s.startTask(v.node, KindStop, id, user, id, func(*Server) string {
			v.status, v.paused = "stopped", false
			return "OK"
		}), nil
	case "shutdown":
		if v.status != "running" {
			return nil, errf(500, "VM %d not running", id)
		}
		timeout, _ := q.p.num("timeout")
		force := q.p.boolean("forceStop", false)
		ignore := v.ignoreACPI
		dur := s.latency(KindShutdown)
		if ignore && timeout > 0 {
			dur = time.Duration(timeout) * time.Second
		}
		return s.startTask(v.node, KindShutdown, id, user, id, func(*Server) string {
			if ignore && !force {
				return "VM quit/powerdown failed - got timeout"
			}
			v.status, v.paused = "stopped", false
			return "OK"
		}, dur), nil
	case "suspend":
		if v.status != "running" {
			return nil, errf(500, "VM %d not running", id)
		}
		return s.startTask(v.node, KindSuspend, id, user, id, func(*Server) string { v.paused = true; return "OK" }), nil
	case "resume":
		if v.status != "running" {
			return nil, errf(500, "VM %d not running", id)
		}
		return s.startTask(v.node, KindResume, id, user, id, func(*Server) string { v.paused = false; return "OK" }), nil
	}
	return nil, errf(501, "Method 'POST %s' not implemented", q.path)
}

// IgnoreShutdown makes a VM ignore ACPI shutdown requests (a shutdown task
// then runs for its timeout and fails unless forceStop is set).
func (s *Server) IgnoreShutdown(vmid int, ignore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[vmid]; ok {
		v.ignoreACPI = ignore
	}
}

func (s *Server) clone(q *request, node string, src int) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[src]
	if v == nil || v.node != node {
		return nil, noConf(node, src)
	}
	if e := s.check(q.tok, fmt.Sprintf("/vms/%d", src), "VM.Clone"); e != nil {
		return nil, e
	}
	if !q.p.has("newid") {
		return nil, badParam("newid", "property is missing and it is not optional")
	}
	newid, err := q.p.num("newid")
	if err != nil || newid < 100 {
		return nil, badParam("newid", "value must have a minimum value of 100")
	}
	target := q.p.str("target")
	if target == "" {
		target = node
	}
	if !s.hasNode(target) {
		return nil, badParam("target", fmt.Sprintf("no such cluster node '%s'", target))
	}
	pool := q.p.str("pool")
	if pool != "" {
		if !s.pools[pool] {
			return nil, errf(500, "pool '%s' does not exist", pool)
		}
		if e := s.check(q.tok, "/pool/"+pool, "VM.Allocate"); e != nil {
			return nil, e
		}
	} else if e := s.check(q.tok, fmt.Sprintf("/vms/%d", newid), "VM.Allocate"); e != nil {
		return nil, e
	}
	full := q.p.boolean("full", !v.template)
	if !full && !v.template {
		return nil, errf(500, "Linked clone feature is not supported for drive 'scsi0'")
	}
	storage := v.storage // a linked clone, and a full one without a target storage, keep the source's
	if full {
		if q.p.has("storage") {
			storage = q.p.str("storage")
		}
		if e := s.check(q.tok, "/storage/"+storage, "Datastore.AllocateSpace"); e != nil {
			return nil, e
		}
	}
	st, ok := s.storageSpec(storage)
	if !ok {
		return nil, errf(500, "storage '%s' does not exist", storage)
	}
	name := q.p.str("name")
	if name == "" {
		name = fmt.Sprintf("Copy-of-VM-%s", v.name)
	}
	if !dnsName.MatchString(name) {
		return nil, badParam("name", "invalid format - value does not look like a valid DNS name")
	}
	if other, ok := s.vms[newid]; ok {
		return nil, errf(500, "VM %d already exists on node '%s'", newid, other.node)
	}
	if !v.template && v.busy != "" {
		return nil, lockErr(src)
	}
	desc := v.description
	if q.p.has("description") {
		desc = q.p.str("description")
	}
	nv := &vm{
		vmid: newid, node: target, name: name, description: desc, tags: v.tags, cores: v.cores, sockets: v.sockets,
		memory: v.memory, onboot: v.onboot, agent: v.agent, pool: pool, status: "stopped", lock: "clone",
		guest:   s.newGuest(newid),
		net0:    fmt.Sprintf("virtio=BC:24:11:%02X:%02X:%02X,bridge=vmbr0", newid>>16&0xff, newid>>8&0xff, newid&0xff),
		scsi0:   fmt.Sprintf("%s:vm-%d-disk-0,size=8G", storage, newid),
		storage: storage, drives: maps.Clone(v.drives),
	}
	// The copy fails once the target storage is full, as qemu-img does.
	fits := s.storageFree(st, target) >= CloneDiskBytes
	if full {
		nv.diskBytes = CloneDiskBytes
	}
	s.vms[newid] = nv
	return s.startTask(node, KindClone, src, q.tok.ID, newid, func(s *Server) string {
		if full && !fits {
			return fmt.Sprintf("clone failed: qemu-img: error while writing at byte %d: No space left on device", CloneDiskBytes/2)
		}
		nv.lock = ""
		return "OK"
	}, 0, func(s *Server) { // on failure PVE removes the half-made clone
		if s.vms[newid] == nv {
			delete(s.vms, newid)
		}
	}), nil
}

// startTask creates a task of kind on node for VM id (the UPID's id
// field), holding the config lock of lockID until it ends; apply runs
// under s.mu at the end and returns the exit status. An optional duration
// overrides the kind's latency; an optional onFail runs when the task
// fails. s.mu must be held.
func (s *Server) startTask(node, kind string, id int, user string, lockID int, apply func(*Server) string, opt ...any) string {
	dur := s.latency(kind)
	var onFail func(*Server)
	for _, o := range opt {
		switch x := o.(type) {
		case time.Duration:
			if x > 0 {
				dur = x
			}
		case func(*Server):
			onFail = x
		}
	}
	s.pidSeq++
	now := time.Now()
	t := &task{node: node, kind: kind, id: strconv.Itoa(id), user: user, pid: s.pidSeq, pstart: s.pidSeq * 37, start: now, lockedID: lockID}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%d:%s:", node, t.pid, t.pstart, now.Unix(), kind, id, user)
	s.tasks[t.upid] = t
	if v := s.vms[lockID]; v != nil {
		v.busy = t.upid
	}
	failExit, fail := s.faults.takeTask(kind)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if dur > 0 {
			select {
			case <-time.After(dur):
			case <-s.closed:
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		exit := "OK"
		if fail {
			exit = failExit
		} else {
			exit = apply(s)
		}
		if exit != "OK" && onFail != nil {
			onFail(s)
		}
		if v := s.vms[lockID]; v != nil && v.busy == t.upid {
			v.busy = ""
		}
		t.done, t.exit, t.end = true, exit, time.Now()
		t.log = append(t.log, "TASK "+map[bool]string{true: "OK", false: "ERROR: " + exit}[exit == "OK"])
	}()
	return t.upid
}

func (s *Server) taskGet(node, upid string, rest []string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[upid]
	if t == nil || t.node != node {
		return nil, errf(500, "no such task")
	}
	switch {
	case len(rest) == 1 && rest[0] == "status":
		st := map[string]any{"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart, "starttime": t.start.Unix(),
			"type": t.kind, "id": t.id, "user": t.user, "status": "running"}
		if t.done {
			st["status"] = "stopped"
			st["exitstatus"] = t.exit
			st["endtime"] = t.end.Unix()
		}
		return st, nil
	case len(rest) == 1 && rest[0] == "log":
		var out []map[string]any
		for i, l := range t.log {
			out = append(out, map[string]any{"n": i + 1, "t": l})
		}
		if out == nil {
			out = []map[string]any{}
		}
		return out, nil
	}
	return nil, errf(501, "not implemented")
}

// agentGate checks that an agent command can reach the guest; s.mu held.
func (s *Server) agentGate(q *request, v *vm, cmd string) (Guest, *apiError) {
	if e := s.check(q.tok, fmt.Sprintf("/vms/%d", v.vmid), s.agentPriv(cmd)); e != nil {
		return nil, e
	}
	if !v.agent {
		return nil, errf(500, "No QEMU guest agent configured")
	}
	if v.status != "running" {
		return nil, errf(500, "VM %d is not running", v.vmid)
	}
	if v.paused || time.Now().Before(v.agentAt) || v.guest == nil {
		return nil, errf(500, "QEMU guest agent is not running")
	}
	return v.guest, nil
}

func agentErr(err error) *apiError {
	return errf(500, "Agent error: %s", err.Error())
}

func (s *Server) agent(q *request, id int, g Guest, cmd string) (any, *apiError) {
	ctx := q.r.Context()
	switch {
	case cmd == "ping" && q.method == http.MethodPost:
		if err := g.Ping(ctx); err != nil {
			return nil, agentErr(err)
		}
		return map[string]any{"result": map[string]any{}}, nil
	case cmd == "get-osinfo" && q.method == http.MethodGet:
		info, err := g.OSInfo(ctx)
		if err != nil {
			return nil, agentErr(err)
		}
		return map[string]any{"result": info}, nil
	case cmd == "file-write" && q.method == http.MethodPost:
		file, content := q.p.str("file"), q.p.str("content")
		if file == "" {
			return nil, badParam("file", "property is missing and it is not optional")
		}
		if len(content) > 61440 {
			return nil, badParam("content", "value may only be 61440 characters long")
		}
		data := []byte(content)
		if !q.p.boolean("encode", true) { // encode=0: content is already base64 and goes to QGA as is
			b, err := base64.StdEncoding.DecodeString(content)
			if err != nil {
				return nil, agentErr(errors.New("Invalid parameter type for 'buf-b64', expected: base64")) //lint:ignore ST1005 QGA's own wording
			}
			data = b
		}
		if err := g.FileWrite(ctx, file, data); err != nil {
			return nil, agentErr(err)
		}
		return nil, nil
	case cmd == "exec" && q.method == http.MethodPost:
		var argv []string
		switch c := q.p["command"].(type) {
		case []any:
			for _, a := range c {
				argv = append(argv, fmt.Sprint(a))
			}
		case string:
			argv = strings.Fields(c)
		}
		if len(argv) == 0 {
			return nil, badParam("command", "property is missing and it is not optional")
		}
		pid, err := g.Exec(ctx, argv, []byte(q.p.str("input-data")))
		if err != nil {
			return nil, agentErr(err)
		}
		return map[string]any{"pid": pid}, nil
	case cmd == "exec-status" && q.method == http.MethodGet:
		pid, err := q.p.num("pid")
		if err != nil || !q.p.has("pid") {
			return nil, badParam("pid", "property is missing and it is not optional")
		}
		st, gerr := g.ExecStatus(ctx, pid)
		if gerr != nil {
			return nil, agentErr(gerr)
		}
		// PVE passes QGA's answer through, base64-decoding out-data and
		// err-data and turning every boolean into 1/0 (qemu-server
		// PVE/QemuServer/Agent.pm qemu_exec_status). QGA reports exitcode or,
		// for a killed process, signal; and a current qemu-ga (upstream
		// commit 28c5d27dd4; seen from Debian 12's 7.2+dfsg-7+deb12u18)
		// reports a stream's truncation flag whenever the stream has data.
		// So "err-truncated": 0 comes with any stderr output.
		out := map[string]any{"exited": b2i(st.Exited)}
		if st.Exited {
			if st.Signal != 0 {
				out["signal"] = st.Signal
			} else {
				out["exitcode"] = st.ExitCode
			}
			if len(st.OutData) > 0 || st.OutTruncated {
				out["out-data"] = string(st.OutData)
				out["out-truncated"] = b2i(st.OutTruncated)
			}
			if len(st.ErrData) > 0 || st.ErrTruncated {
				out["err-data"] = string(st.ErrData)
				out["err-truncated"] = b2i(st.ErrTruncated)
			}
		}
		return out, nil
	}
	return nil, errf(501, "Method '%s %s' not implemented", q.method, q.path)
}

func (s *Server) permissions(q *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]int{}
	add := func(path string) {
		m := map[string]int{}
		for p := range s.privs(q.tok, path) {
			m[p] = 1
		}
		out[path] = m
	}
	if p := q.p.str("path"); p != "" {
		add(p)
		return out, nil
	}
	for p := range q.tok.ACL {
		add(p)
	}
	return out, nil
}

func (s *Server) poolList(q *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	members := func(pool string) []map[string]any {
		out := []map[string]any{}
		for _, v := range s.sortedVMs() {
			if v.pool == pool {
				out = append(out, s.resourceOf(v, false))
			}
		}
		return out
	}
	if id := q.p.str("poolid"); id != "" {
		if !s.pools[id] {
			return nil, errf(500, "pool '%s' does not exist", id)
		}
		return []map[string]any{{"poolid": id, "members": members(id)}}, nil
	}
	var names []string
	for p := range s.pools {
		names = append(names, p)
	}
	sort.Strings(names)
	out := []map[string]any{}
	for _, p := range names {
		out = append(out, map[string]any{"poolid": p})
	}
	return out, nil
}
