package pvesim

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Match selects requests for a fault: Method ("" any) and a substring of
// the path below /api2/json ("" any), e.g. {"PUT", "/qemu/101/config"}.
type Match struct {
	Method string
	Path   string
}

func (m Match) matches(method, path string) bool {
	return (m.Method == "" || strings.EqualFold(m.Method, method)) && strings.Contains(path, m.Path)
}

type faultKind int

const (
	faultStatus faultKind = iota
	faultLock
	faultForbidden
	faultDelay
)

type fault struct {
	match  Match
	kind   faultKind
	left   int // remaining hits; <0 forever
	code   int
	reason string
	delay  time.Duration
	hits   int
}

type taskFault struct {
	kind string
	left int
	exit string
}

type faults struct {
	http       []*fault
	tasks      []*taskFault
	fixedNext  int
	nextIDHits int
	hook       RequestHook
}

func (f *faults) init() {}

// take returns the first matching HTTP fault and consumes one hit.
func (f *faults) take(method, path string) *fault {
	for _, x := range f.http {
		if x.left == 0 || !x.match.matches(method, path) {
			continue
		}
		if x.left > 0 {
			x.left--
		}
		x.hits++
		c := *x
		return &c
	}
	return nil
}

func (f *faults) takeTask(kind string) (string, bool) {
	for _, x := range f.tasks {
		if x.left == 0 || (x.kind != "" && x.kind != kind) {
			continue
		}
		if x.left > 0 {
			x.left--
		}
		return x.exit, true
	}
	return "", false
}

// InjectStatus makes the next times matching requests (times < 0: all)
// fail with an HTTP status and reason phrase, e.g. 503 "Service
// Unavailable" or 500 "got unexpected error".
func (s *Server) InjectStatus(m Match, times, code int, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.http = append(s.faults.http, &fault{match: m, kind: faultStatus, left: times, code: code, reason: reason})
}

// InjectLockErrors makes the next times matching requests fail like a
// config-file lock timeout: 500 "can't lock file
// '/var/lock/qemu-server/lock-<vmid>.conf' - got timeout".
func (s *Server) InjectLockErrors(m Match, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.http = append(s.faults.http, &fault{match: m, kind: faultLock, left: times})
}

// InjectForbidden makes the next times matching requests fail with 403
// "Permission check failed (<path>, <priv>)".
func (s *Server) InjectForbidden(m Match, times int, path, priv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.http = append(s.faults.http, &fault{match: m, kind: faultForbidden, left: times, code: 403,
		reason: fmt.Sprintf("Permission check failed (%s, %s)", path, priv)})
}

// InjectDelay holds the next times matching requests for d before serving
// them (a hang when d exceeds the client's timeout).
func (s *Server) InjectDelay(m Match, times int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.http = append(s.faults.http, &fault{match: m, kind: faultDelay, left: times, delay: d})
}

// FailTasks makes the next times tasks of kind ("" any) end with exit
// status exit instead of "OK". A failed clone removes the half-made VM, as
// PVE does.
func (s *Server) FailTasks(kind string, times int, exit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.tasks = append(s.faults.tasks, &taskFault{kind: kind, left: times, exit: exit})
}

// FixNextID makes /cluster/nextid always answer id, free or not, the way
// concurrent callers all see the same id (0 restores the real behaviour).
func (s *Server) FixNextID(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.fixedNext = id
}

// AgentDownFor makes a VM's guest agent answer "QEMU guest agent is not
// running" for d from now (while the VM runs).
func (s *Server) AgentDownFor(vmid int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[vmid]; ok {
		v.agentAt = time.Now().Add(d)
	}
}

// RequestHook wraps the handling of every request: the per-request fault
// seam for tests. serve handles the request as the simulated PVE does and
// writes its answer to the writer given; the hook calls it at most once.
// It may answer without serving (the request never reached PVE), serve to
// a throw-away writer and then fail or drop the connection (PVE acted but
// the answer was lost), or serve to w (the request goes through).
type RequestHook func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter))

// SetRequestHook installs h (nil removes it); ClearFaults removes it too.
func (s *Server) SetRequestHook(h RequestHook) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.hook = h
}

// serveHooked passes a request through the RequestHook, if any.
func (s *Server) serveHooked(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	h := s.faults.hook
	s.mu.Unlock()
	if h == nil {
		s.serve(w, r)
		return
	}
	h(w, r, func(w http.ResponseWriter) { s.serve(w, r) })
}

// ClearFaults removes every injected fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = faults{}
}
