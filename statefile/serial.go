package statefile

import "sync"

// serial runs funcs one at a time, in the order they were posted, never
// on the poster's goroutine. Its goroutine exists only while there is
// work, so an idle or abandoned serial holds nothing.
type serial struct {
	mu      sync.Mutex
	idle    sync.Cond
	queue   []func()
	running bool
}

// post queues fn to run after every fn posted before it.
func (s *serial) post(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, fn)
	if !s.running {
		s.running = true
		go s.run()
	}
}

func (s *serial) run() {
	s.mu.Lock()
	for len(s.queue) > 0 {
		fn := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.mu.Unlock()
		fn()
		s.mu.Lock()
	}
	s.queue = nil
	s.running = false
	if s.idle.L != nil {
		s.idle.Broadcast()
	}
	s.mu.Unlock()
}

// wait returns once everything posted so far, and everything that posts
// meanwhile, has run. It must not be called from a posted func.
func (s *serial) wait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idle.L == nil {
		s.idle.L = &s.mu
	}
	for s.running {
		s.idle.Wait()
	}
}
