package pvesim

import (
	"crypto/sha1"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"
)

// Task kinds, as they appear in UPIDs.
const (
	KindClone    = "qmclone"
	KindStart    = "qmstart"
	KindStop     = "qmstop"
	KindShutdown = "qmshutdown"
	KindDestroy  = "qmdestroy"
	KindConfig   = "qmconfig"
	KindResume   = "qmresume"
	KindSuspend  = "qmsuspend"
)

// Latencies are the durations of tasks by kind, plus the time a started
// VM's guest agent needs before it answers.
type Latencies struct {
	Task map[string]time.Duration
	// AgentBoot is the time from the end of a start task until the guest
	// agent answers.
	AgentBoot time.Duration
}

// DefaultLatencies are roughly those of a small PVE node with local LVM.
func DefaultLatencies() *Latencies {
	return &Latencies{
		Task: map[string]time.Duration{
			KindClone:    2 * time.Second,
			KindStart:    1 * time.Second,
			KindStop:     500 * time.Millisecond,
			KindShutdown: 1 * time.Second,
			KindDestroy:  1 * time.Second,
			KindConfig:   100 * time.Millisecond,
			KindResume:   100 * time.Millisecond,
			KindSuspend:  100 * time.Millisecond,
		},
		AgentBoot: 1500 * time.Millisecond,
	}
}

// ZeroLatency makes every task finish (almost) at once; tasks still run
// asynchronously, so the client still polls.
func ZeroLatency() *Latencies { return &Latencies{Task: map[string]time.Duration{}} }

// Options configure a simulator.
type Options struct {
	// Nodes are the cluster's node names (default: pve1).
	Nodes []string
	// Version is the reported PVE version (default 8.2.4). A major version
	// of 9 or more switches agent privileges from VM.Monitor to
	// VM.GuestAgent.*.
	Version string
	// Latencies default to DefaultLatencies().
	Latencies *Latencies
	// LatencyScale multiplies every latency (0 means 1).
	LatencyScale float64
	// Storage is the default storage (default local-lvm): a local storage
	// on every node, sized by Host, holding the disks of the VMs added
	// without VMSpec.Storage.
	Storage string
	// Host is every node's capacity as its status and the storage's status
	// report it (default: 64 GiB, 16 CPUs, a 1 TiB storage with 900 GiB
	// free).
	Host HostCapacity
	// Storages are the cluster's further storages.
	Storages []Storage
	// Logger receives one debug line per request (never a secret).
	Logger *slog.Logger
}

// HostCapacity is a simulated node's size.
type HostCapacity struct {
	MemoryBytes      uint64
	CPUs             int
	StorageBytes     uint64 // the clone storage's total
	StorageFreeBytes uint64 // and what is free on it
}

// Storage is a simulated storage. A full clone takes CloneDiskBytes of
// it (on the clone's node, or of the one pool when Shared) until the
// clone is destroyed; a clone that does not fit fails as PVE's does, with
// "No space left on device".
type Storage struct {
	Name string
	// Shared storages (ceph, nfs) are one pool every node sees; the others
	// are one pool per node.
	Shared bool
	// Bytes and FreeBytes are each pool's size and its free space before
	// any clone this simulator makes.
	Bytes, FreeBytes uint64
}

// CloneDiskBytes is the size of every simulated VM's one disk (scsi0,
// size=8G): what a full clone takes of its target storage.
const CloneDiskBytes = 8 << 30

// Token is an API token with its ACLs.
type Token struct {
	ID     string // user@realm!name
	Secret string
	// ACL maps a path ("/", "/vms", "/vms/100", "/pool/fleet",
	// "/storage/local-lvm", "/nodes/pve1") to the privileges granted there;
	// grants propagate to every path below.
	ACL map[string][]string
}

// AllPrivileges is every privilege the simulator checks.
var AllPrivileges = []string{
	"VM.Allocate", "VM.Clone", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory",
	"VM.Config.Options", "VM.Config.Disk", "VM.Config.Network", "VM.PowerMgmt",
	"VM.Monitor", "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead",
	"VM.GuestAgent.FileWrite", "VM.GuestAgent.FileSystemMgmt",
	"VM.GuestAgent.Unrestricted", "Datastore.AllocateSpace", "Datastore.Audit",
	"Sys.Audit", "Pool.Audit", "Pool.Allocate",
}

// VMSpec describes a VM or template created directly in the simulator.
type VMSpec struct {
	VMID        int
	Node        string
	Name        string
	Template    bool
	Cores       int
	MemoryMiB   int
	Tags        []string
	Description string
	Pool        string
	Running     bool
	OnBoot      bool
	// NoAgent leaves "agent" unset in the config ("No QEMU guest agent
	// configured").
	NoAgent bool
	// Storage holds the VM's disk, scsi0 (default Options.Storage). The
	// disk of a VM added here is counted in the storage's FreeBytes
	// already.
	Storage string
	// Drives are further config entries, key to value, e.g. "efidisk0":
	// "ceph:vm-9000-disk-1,size=4M" or "ide2":
	// "local-lvm:vm-9000-cloudinit,media=cdrom"; a clone copies them.
	Drives map[string]string
}

type vm struct {
	vmid        int
	node        string
	name        string
	description string
	tags        string
	cores       int
	sockets     int
	memory      int
	onboot      bool
	template    bool
	agent       bool
	pool        string
	status      string // running | stopped
	paused      bool
	lock        string // config lock shown in config/status (clone, ...)
	busy        string // UPID of the task holding the config file lock
	startedAt   time.Time
	agentAt     time.Time // agent answers from then on
	guest       Guest
	net0, scsi0 string
	// storage holds scsi0; diskBytes is what the VM takes of it beyond
	// the storage's FreeBytes (a clone's disk; 0 for VMs added by AddVM).
	storage    string
	diskBytes  uint64
	drives     map[string]string
	ignoreACPI bool
}

func (v *vm) digest() string {
	h := sha1.New()
	fmt.Fprintf(h, "%s|%s|%s|%d|%d|%d|%t|%t|%s|%s", v.name, v.description, v.tags, v.cores,
		v.sockets, v.memory, v.onboot, v.template, v.lock, v.pool)
	return hex.EncodeToString(h.Sum(nil))
}

type task struct {
	upid     string
	node     string
	kind     string
	id       string
	user     string
	pid      int
	pstart   int
	start    time.Time
	end      time.Time
	done     bool
	exit     string
	log      []string
	lockedID int // VMID whose config lock the task holds (0: none)
}

// Server is one simulated cluster. It is safe for concurrent use.
type Server struct {
	opts  Options
	lat   *Latencies
	scale float64
	log   *slog.Logger

	mu    sync.Mutex
	nodes []string
	// down maps a node that is not online to the status the cluster gives
	// it ("offline", "unknown"); see SetNodeStatus.
	down     map[string]string
	vms      map[int]*vm
	tasks    map[string]*task
	tokens   map[string]*Token
	pools    map[string]bool
	pidSeq   int
	faults   faults
	requests map[string]int // "METHOD /path" (VMIDs and UPIDs kept) -> count
	total    int
	newGuest func(vmid int) Guest
	closed   chan struct{}
	wg       sync.WaitGroup
}

// New returns a simulator with no VMs, tokens or pools.
func New(opts Options) *Server {
	if len(opts.Nodes) == 0 {
		opts.Nodes = []string{"pve1"}
	}
	if opts.Version == "" {
		opts.Version = "8.2.4"
	}
	if opts.Storage == "" {
		opts.Storage = "local-lvm"
	}
	if opts.Host == (HostCapacity{}) {
		opts.Host = HostCapacity{MemoryBytes: 64 << 30, CPUs: 16, StorageBytes: 1 << 40, StorageFreeBytes: 900 << 30}
	}
	lat := opts.Latencies
	if lat == nil {
		lat = DefaultLatencies()
	}
	scale := opts.LatencyScale
	if scale == 0 {
		scale = 1
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		opts:     opts,
		lat:      lat,
		scale:    scale,
		log:      lg,
		nodes:    append([]string(nil), opts.Nodes...),
		down:     map[string]string{},
		vms:      map[int]*vm{},
		tasks:    map[string]*task{},
		tokens:   map[string]*Token{},
		pools:    map[string]bool{},
		pidSeq:   0x1000,
		requests: map[string]int{},
		closed:   make(chan struct{}),
	}
	s.faults.init()
	s.newGuest = func(int) Guest { return NewMemGuest() }
	return s
}

// SetLatencyScale changes the latency multiplier (0 makes tasks instant).
func (s *Server) SetLatencyScale(f float64) {
	s.mu.Lock()
	s.scale = f
	s.mu.Unlock()
}

func (s *Server) latency(kind string) time.Duration {
	return time.Duration(float64(s.lat.Task[kind]) * s.scale)
}

func (s *Server) agentBoot() time.Duration {
	return time.Duration(float64(s.lat.AgentBoot) * s.scale)
}

// AddToken registers an API token.
func (s *Server) AddToken(t Token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := t
	s.tokens[t.ID] = &c
}

// FullAccess is an ACL granting every privilege on "/".
func FullAccess() map[string][]string { return map[string][]string{"/": AllPrivileges} }

// Revoke removes a privilege from a token's ACL at path.
func (s *Server) Revoke(tokenID, path, priv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tokens[tokenID]
	if t == nil {
		return
	}
	acl := map[string][]string{}
	for p, privs := range t.ACL {
		acl[p] = append([]string(nil), privs...)
	}
	var keep []string
	for _, p := range acl[path] {
		if p != priv {
			keep = append(keep, p)
		}
	}
	acl[path] = keep
	t.ACL = acl
}

// AddPool creates a resource pool.
func (s *Server) AddPool(name string) {
	s.mu.Lock()
	s.pools[name] = true
	s.mu.Unlock()
}

// SetGuestFactory replaces the function that makes the guest agent of each
// new VM (default: NewMemGuest).
func (s *Server) SetGuestFactory(f func(vmid int) Guest) {
	s.mu.Lock()
	s.newGuest = f
	s.mu.Unlock()
}

// AddVM creates a VM or template directly (no task, no checks but VMID
// uniqueness).
func (s *Server) AddVM(spec VMSpec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vms[spec.VMID]; ok {
		return fmt.Errorf("VM %d already exists", spec.VMID)
	}
	if spec.Node == "" {
		spec.Node = s.nodes[0]
	}
	if spec.Cores == 0 {
		spec.Cores = 1
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 512
	}
	if spec.Storage == "" {
		spec.Storage = s.opts.Storage
	}
	if _, ok := s.storageSpec(spec.Storage); !ok {
		return fmt.Errorf("storage %q does not exist", spec.Storage)
	}
	v := &vm{
		vmid: spec.VMID, node: spec.Node, name: spec.Name, template: spec.Template,
		cores: spec.Cores, sockets: 1, memory: spec.MemoryMiB, tags: strings.Join(spec.Tags, ";"),
		description: spec.Description, pool: spec.Pool, onboot: spec.OnBoot, agent: !spec.NoAgent,
		status: "stopped", guest: s.newGuest(spec.VMID),
		net0:    fmt.Sprintf("virtio=BC:24:11:%02X:%02X:%02X,bridge=vmbr0", spec.VMID>>16&0xff, spec.VMID>>8&0xff, spec.VMID&0xff),
		scsi0:   fmt.Sprintf("%s:vm-%d-disk-0,size=8G", spec.Storage, spec.VMID),
		storage: spec.Storage, drives: maps.Clone(spec.Drives),
	}
	if spec.Running {
		v.status = "running"
		v.startedAt = time.Now()
		v.agentAt = v.startedAt
	}
	s.vms[spec.VMID] = v
	return nil
}

// storageSpec is the storage named name. s.mu must be held or opts
// unchanged since New.
func (s *Server) storageSpec(name string) (Storage, bool) {
	if name == s.opts.Storage {
		return Storage{Name: name, Bytes: s.opts.Host.StorageBytes, FreeBytes: s.opts.Host.StorageFreeBytes}, true
	}
	for _, st := range s.opts.Storages {
		if st.Name == name {
			return st, true
		}
	}
	return Storage{}, false
}

// storageFree is what is free of st on node: its FreeBytes less the disks
// of the clones on it. s.mu must be held.
func (s *Server) storageFree(st Storage, node string) uint64 {
	var used uint64
	for _, v := range s.vms {
		if v.storage == st.Name && (st.Shared || v.node == node) {
			used += v.diskBytes
		}
	}
	return st.FreeBytes - min(used, st.FreeBytes)
}

// StorageFree is what is free of the storage named name on node, as its
// status reports it (false: no such storage).
func (s *Server) StorageFree(node, name string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.storageSpec(name)
	if !ok {
		return 0, false
	}
	return s.storageFree(st, node), true
}

// RemoveVM deletes a VM out of band (as an operator would); it reports
// whether the VM existed.
func (s *Server) RemoveVM(vmid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.vms[vmid]
	delete(s.vms, vmid)
	return ok
}

// VMInfo is a read-only view of a simulated VM for assertions.
type VMInfo struct {
	VMID        int
	Node        string
	Name        string
	Description string
	Tags        string
	Cores       int
	MemoryMiB   int
	OnBoot      bool
	Template    bool
	Pool        string
	Status      string
	Paused      bool
	Lock        string
}

// VM returns a VM's state, if it exists.
func (s *Server) VM(vmid int) (VMInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[vmid]
	if !ok {
		return VMInfo{}, false
	}
	return VMInfo{VMID: v.vmid, Node: v.node, Name: v.name, Description: v.description, Tags: v.tags,
		Cores: v.cores, MemoryMiB: v.memory, OnBoot: v.onboot, Template: v.template, Pool: v.pool,
		Status: v.status, Paused: v.paused, Lock: v.lock}, true
}

// VMIDs lists every VMID, sorted.
func (s *Server) VMIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int, 0, len(s.vms))
	for id := range s.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

// GuestOf returns a VM's guest agent backend.
func (s *Server) GuestOf(vmid int) Guest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[vmid]; ok {
		return v.guest
	}
	return nil
}

// SetPaused pauses or unpauses a running VM out of band.
func (s *Server) SetPaused(vmid int, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[vmid]; ok && v.status == "running" {
		v.paused = paused
	}
}

// SetPower starts or stops a VM out of band (no task).
func (s *Server) SetPower(vmid int, running bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[vmid]; ok {
		if running {
			v.status, v.startedAt = "running", time.Now()
			v.agentAt = v.startedAt.Add(s.agentBoot())
		} else {
			v.status, v.paused = "stopped", false
		}
	}
}

// SetNodeStatus sets the status the cluster reports for a node: "online"
// (the default) or, as PVE does for a node that left the quorate
// partition or sends no statistics, "offline" or "unknown". While a node
// is not online, /cluster/resources lists its VMs with status "unknown"
// and without statistics, /nodes and /cluster/status show it so, and
// every request under /nodes/<node>/ fails as pveproxy's proxy to it does
// (595 "Errors during connection establishment, proxy handler: No route
// to host").
func (s *Server) SetNodeStatus(node, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if status == "online" {
		delete(s.down, node)
		return
	}
	s.down[node] = status
}

// Requests returns how many requests were served, by "METHOD /path".
func (s *Server) Requests() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.requests))
	for k, v := range s.requests {
		out[k] = v
	}
	return out
}

// RequestCount returns the number of requests whose "METHOD /path" key
// contains substr ("" counts all).
func (s *Server) RequestCount(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if substr == "" {
		return s.total
	}
	n := 0
	for k, v := range s.requests {
		if strings.Contains(k, substr) {
			n += v
		}
	}
	return n
}

// Close stops task goroutines; the HTTP servers are closed by their owners.
func (s *Server) Close() {
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	s.wg.Wait()
}

// NewTLSServer starts the simulator on an httptest TLS server (HTTP/1.1
// only, so error reason phrases can be written). Close both when done.
func (s *Server) NewTLSServer() *httptest.Server {
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.EnableHTTP2 = false
	srv.StartTLS()
	return srv
}

// Serve listens on addr with cert and serves until the listener fails.
// With a zero certificate it generates a self-signed one and logs its
// SHA-256 fingerprint.
func (s *Server) Serve(addr string, cert tls.Certificate) error {
	if len(cert.Certificate) == 0 {
		c, fp, err := SelfSigned([]string{"localhost", "127.0.0.1"})
		if err != nil {
			return fmt.Errorf("self-signed certificate: %w", err)
		}
		cert = c
		s.log.Info("pvesim certificate", "sha256", fp)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){}, // HTTP/1.1 only
		ReadHeaderTimeout: 10 * time.Second,
	}
	s.log.Info("pvesim serving", "addr", ln.Addr().String(), "nodes", strings.Join(s.nodes, ","))
	return srv.ServeTLS(ln, "", "")
}
